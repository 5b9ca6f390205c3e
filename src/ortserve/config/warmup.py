"""The warm-up section of a model's ``config.yaml``: samples run before a version serves."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["WarmupInput", "WarmupSample"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WarmupInput(_Strict):
    """One input of a warm-up sample: its type, its dims (one row when batching) and its data."""

    datatype: str
    dims: list[Annotated[int, Field(ge=0)]]
    data: Literal["zero", "random", "file"] = "zero"
    file: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,255}$")] | None = None
    """A file name in the model's ``warmup/`` folder: the raw row-major bytes of one row (BYTES:
    each element a 4-byte little-endian length, then its bytes), repeated for each row."""

    @model_validator(mode="after")
    def _file_with_file_data(self) -> WarmupInput:
        if (self.data == "file") != (self.file is not None):
            raise ValueError("data: file needs a file name, and a file name needs data: file")
        return self


class WarmupSample(_Strict):
    """One warm-up request, run ``count`` times before the version serves."""

    name: str
    batch_size: Annotated[int, Field(ge=0)] = 1
    """Rows; with batching off, 0 or 1 (the inputs are sent as their dims)."""
    count: Annotated[int, Field(ge=1, le=1000)] = 1
    inputs: dict[str, WarmupInput]
