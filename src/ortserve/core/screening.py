"""Screening an assembled batch: one cheap check for the batch, the exact one per request only
when the cheap one fails."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ortserve.errors import InvalidInput

__all__ = ["BatchScreen", "Screened", "split_refused"]

Array = npt.NDArray[np.generic]


class BatchScreen(Protocol):
    """Value limits a batch's inputs must keep (the input sandbox implements it)."""

    def passes(self, feeds: Mapping[str, Array]) -> bool:
        """Whether every element of these feeds (a whole batch) is proven fine; cheap."""
        ...

    def check(self, feeds: Mapping[str, Array]) -> None:
        """Check one request's feeds exactly.

        Raises:
            InvalidInput: naming the input and the request's own offending element.
        """
        ...


class Screened(Protocol):
    """A queued request: what the screen reads of it."""

    @property
    def feeds(self) -> Mapping[str, Array]: ...


R = TypeVar("R", bound=Screened)


def split_refused(screen: BatchScreen, requests: Sequence[R]) -> tuple[list[R], list[tuple[R, InvalidInput]]]:
    """The requests whose own feeds pass ``screen.check``, and the others with their errors
    (for a batch that ``screen.passes`` could not prove fine), in order."""
    served: list[R] = []
    refused: list[tuple[R, InvalidInput]] = []
    for request in requests:
        try:
            screen.check(request.feeds)
        except InvalidInput as error:
            refused.append((request, error))
        else:
            served.append(request)
    return served, refused
