"""Sorting a failed session run into transient, persistent or input-caused."""

from __future__ import annotations

import enum

__all__ = ["FailureKind", "InjectedFault", "classify"]


class FailureKind(enum.Enum):
    """Why a run failed, which decides what the breaker and the request see.

    TRANSIENT and PERSISTENT failures are the level's: the batch is retried on the next level
    and the failure counts against the level's breaker (persistent ones also towards the
    consecutive-failure limit). INPUT failures are the request's: 400, never counted.
    """

    TRANSIENT = "transient"
    PERSISTENT = "persistent"
    INPUT = "input"


class InjectedFault(RuntimeError):
    """A failure made on purpose by fault injection (``faults:``), carrying its kind."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ONNX Runtime raises one exception class per status code (onnxruntime_pybind11_state):
# INVALID_ARGUMENT is a feed the graph cannot take (shape, rank, type, an index out of range
# in a Gather), the request's fault.
_INPUT_CLASSES = frozenset({"InvalidArgument"})
_DEVICE_CLASSES = frozenset({"EPFail", "EngineError", "ModelLoaded", "NotImplemented"})
_TRANSIENT_TEXT = ("bad_alloc", "failed to allocate", "out of memory", "outofmemory", "resource exhausted")
_PERSISTENT_TEXT = ("cuda", "cublas", "cudnn", "tensorrt", "device", "driver", "illegal memory", "ecc")


def classify(error: BaseException) -> FailureKind:
    """The kind of a run's failure, from its type and message.

    Allocation failures are transient (a one-off; the next batch may well fit); invalid
    arguments are the input's; everything else (device or provider errors, unknown failures)
    is persistent, so a model that keeps failing for a reason nobody foresaw still falls back.
    """
    if isinstance(error, InjectedFault):
        return error.kind
    if isinstance(error, MemoryError):
        return FailureKind.TRANSIENT
    name = type(error).__name__
    text = str(error).lower()
    if name in _INPUT_CLASSES:
        return FailureKind.INPUT
    if name in _DEVICE_CLASSES or any(word in text for word in _PERSISTENT_TEXT):
        return FailureKind.PERSISTENT
    if any(word in text for word in _TRANSIENT_TEXT):
        return FailureKind.TRANSIENT
    return FailureKind.PERSISTENT
