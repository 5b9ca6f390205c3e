"""What both transports' edge refusals share: the load verdict, and its answer encoded once.

HTTP refuses from the path and headers (``http/admission.py``), gRPC from the message's first
bytes (``grpc/service.py``); both ask the scheduler's kept verdict and answer every request it
refuses with the same bytes, encoded the first time (issue 10: refusals priced against the
floor).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from ortserve.errors import ModelNotReady, OrtServeError, Overloaded

if TYPE_CHECKING:
    from ortserve.core.dataplane import DataPlane  # the supervisor imports this, not ONNX Runtime

__all__ = ["EncodedRefusals", "edge_verdict"]

_T = TypeVar("_T")
_MAX_ANSWERS = 64  # encoded refusals kept (one per model and lane in force)
_LOAD_REFUSALS = (Overloaded, ModelNotReady)


def edge_verdict(
    dataplane: DataPlane, name: str, version: str | None, tenant_of: Callable[[], str | None] | None = None
) -> OrtServeError | bool:
    """The load refusal (Overloaded, ModelNotReady) a request would get now, or whether the
    full path takes it: True when nothing refuses it now (the full path need not ask again
    before decoding it), False when another error will (an unknown model: the full path
    answers it with its own status)."""
    # The most urgent lane: the body may ask for it, and it is refused last.
    error = dataplane.refusal(name, version, 1, tenant_of)
    if error is None:
        return True
    return error if isinstance(error, _LOAD_REFUSALS) else False


class EncodedRefusals(Generic[_T]):
    """Each kept refusal's answer, encoded once for every request it refuses.

    Args:
        encode: the transport's answer to an error.
    """

    def __init__(self, encode: Callable[[OrtServeError], _T]) -> None:
        self._encode = encode
        self._answers: dict[int, tuple[OrtServeError, _T]] = {}

    def answer(self, error: OrtServeError) -> _T:
        known = self._answers.get(id(error))
        if known is not None and known[0] is error:  # the same verdict, not a reused id
            return known[1]
        if len(self._answers) >= _MAX_ANSWERS:
            self._answers.clear()
        answer = self._encode(error)
        self._answers[id(error)] = (error, answer)
        return answer
