"""Warm-up samples a model declares (Triton's ``model_warmup``): requests run before it serves.

The generated warm-up (random rows at batch 1 and at max_batch_size) teaches the batch-cost
model, but some graphs only reach their slow paths with real data (an embedding lookup, a
sequence length, a branch on an id), so a config may name samples of its own: zeros, random
values, or the raw bytes of a file in the model's ``warmup/`` folder, as Triton reads them.
Every sample is checked against the graph first, so a wrong sample fails the load with a
message naming the sample and the input, never a request later.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ortserve.config.warmup import WarmupInput, WarmupSample
from ortserve.core.datatypes import numpy_dtype
from ortserve.core.types import TensorSpec
from ortserve.errors import ConfigError

__all__ = ["WARMUP_FOLDER", "WarmupInput", "WarmupSample", "sample_feeds"]

WARMUP_FOLDER = "warmup"
"""Where ``file`` samples live, inside the model folder (Triton's layout)."""
_MAX_ELEMENTS = 1 << 26
"""Most elements one warm-up input may have (a typo in dims must not allocate gigabytes)."""

Array = npt.NDArray[np.generic]


def sample_feeds(
    sample: WarmupSample, specs: tuple[TensorSpec, ...], max_batch_size: int, model_dir: Path
) -> dict[str, Array]:
    """The feeds of one sample, checked against the graph's inputs.

    Raises:
        ConfigError: an input the graph lacks or lacks in the sample, another datatype, dims
            that do not fit, a batch size out of range, a missing or wrongly sized file.
    """
    where = f"model_warmup {sample.name!r}"
    rows = sample.batch_size
    if max_batch_size and not 1 <= rows <= max_batch_size:
        raise ConfigError(f"{where}: batch_size {rows} is not within 1..max_batch_size {max_batch_size}")
    if not max_batch_size and rows > 1:
        raise ConfigError(f"{where}: batch_size {rows} needs batching (max_batch_size > 0)")
    by_name = {spec.name: spec for spec in specs}
    unknown = sorted(set(sample.inputs) - set(by_name))
    missing = sorted(set(by_name) - set(sample.inputs))
    if unknown or missing:
        raise ConfigError(f"{where}: inputs not in the graph {unknown}, graph inputs not given {missing}")
    rng = np.random.default_rng(0)
    return {
        name: _feed(
            f"{where} input {name!r}",
            sample.inputs[name],
            by_name[name],
            rows,
            max_batch_size,
            model_dir,
            rng,
        )
        for name in by_name
    }


def _feed(
    where: str,
    given: WarmupInput,
    spec: TensorSpec,
    rows: int,
    max_batch_size: int,
    model_dir: Path,
    rng: np.random.Generator,
) -> Array:
    if given.datatype != spec.datatype:
        raise ConfigError(f"{where}: datatype {given.datatype} but the graph takes {spec.datatype}")
    shape = (rows, *given.dims) if max_batch_size else tuple(given.dims)
    fits = len(shape) == len(spec.shape) and all(d in (-1, s) for d, s in zip(spec.shape, shape, strict=True))
    if not fits:
        raise ConfigError(f"{where}: shape {list(shape)} does not fit the graph's {list(spec.shape)}")
    row_elements = math.prod(given.dims)
    if row_elements * max(rows, 1) > _MAX_ELEMENTS:
        raise ConfigError(f"{where}: {row_elements * max(rows, 1)} elements is more than a warm-up takes")
    if given.data == "file":
        row = _read_row(where, model_dir / WARMUP_FOLDER / str(given.file), spec.datatype, row_elements)
        one = row.reshape(given.dims)
        return np.ascontiguousarray(np.broadcast_to(one, shape)) if max_batch_size else one
    dtype = numpy_dtype(spec.datatype)
    if spec.datatype == "BYTES":
        return np.full(shape, b"" if given.data == "zero" else b"warmup", dtype=object)
    if given.data == "zero":
        return np.zeros(shape, dtype=dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.integers(0, 10, shape).astype(dtype)  # small ids: valid for any lookup table


def _read_row(where: str, path: Path, datatype: str, elements: int) -> Array:
    """One row of ``elements`` from ``path``; its size is checked before it is read."""
    try:
        size = path.stat().st_size
        if datatype != "BYTES":
            expected = elements * numpy_dtype(datatype).itemsize
            if size != expected:
                raise ConfigError(f"{where}: {path} has {size} bytes, one row of {datatype} is {expected}")
            return np.frombuffer(path.read_bytes(), dtype=numpy_dtype(datatype))
        if size > 64 * elements + (64 << 20):
            raise ConfigError(f"{where}: {path} is larger than a warm-up row of {elements} strings")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None
    return _strings(where, path, raw, elements)


def _strings(where: str, path: Path, raw: bytes, elements: int) -> Array:
    found: list[bytes] = []
    at = 0
    while at < len(raw) and len(found) < elements:
        if at + 4 > len(raw):
            break
        (length,) = struct.unpack_from("<I", raw, at)
        found.append(raw[at + 4 : at + 4 + length])
        at += 4 + length
    if len(found) != elements or at != len(raw):
        raise ConfigError(f"{where}: {path} is not {elements} length-prefixed strings")
    return np.array(found, dtype=object)
