"""Level 3: default answers, static from config or the last good answer for an identical input."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np
import numpy.typing as npt

from ortserve.config.resilience import DefaultAnswerConfig
from ortserve.core.datatypes import numpy_dtype
from ortserve.core.types import TensorSpec
from ortserve.errors import ConfigError

__all__ = ["DefaultAnswers", "NoDefaultAnswer"]

Array = npt.NDArray[np.generic]
Feeds = dict[str, Array]


class NoDefaultAnswer(LookupError):
    """A row has neither a remembered answer nor a static default."""


class DefaultAnswers:
    """Answers a batch row by row: the last good answer for that exact row, else the static one.

    Rows are keyed by a BLAKE2 digest of every input's bytes, shape and dtype; the memory is an
    LRU bounded to ``last_good`` rows (each row holds its outputs' arrays only). Remembering is
    off unless configured: hashing every answered row costs time on the hot path.

    Args:
        config: the ``fallback.default`` section.
        inputs, outputs: the graph's specs, in order.
        batched: whether dimension 0 is the batch (rows); else the whole feed is one row.
        where: the config file, for errors.

    Raises:
        ConfigError: a static output is missing, unknown, or does not fit its shape.
    """

    def __init__(
        self,
        config: DefaultAnswerConfig,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        batched: bool,
        where: str,
    ) -> None:
        self._input_names = [spec.name for spec in inputs]
        self._batched = batched
        self._capacity = config.last_good
        self._memory: OrderedDict[bytes, list[Array]] = OrderedDict()
        self._lock = threading.Lock()
        self._static = None if config.outputs is None else _static_rows(config, outputs, batched, where)

    @property
    def remembers(self) -> bool:
        return self._capacity > 0

    @property
    def has_static(self) -> bool:
        return self._static is not None

    def remember(self, feeds: Feeds, outputs: list[Array]) -> None:
        """Keep each row's answer (called after a good run when remembering is on)."""
        rows = _row_count(feeds, self._input_names, self._batched)
        keys = [self._key(feeds, row) for row in range(rows)]
        with self._lock:
            for row, key in enumerate(keys):
                self._memory[key] = [np.array(out[row] if self._batched else out) for out in outputs]
                self._memory.move_to_end(key)
            while len(self._memory) > self._capacity:
                self._memory.popitem(last=False)

    def answer(self, feeds: Feeds) -> list[Array]:
        """The batch's outputs, assembled row by row.

        Raises:
            NoDefaultAnswer: some row has no remembered answer and there is no static one.
        """
        rows = _row_count(feeds, self._input_names, self._batched)
        answers: list[list[Array]] = []
        for row in range(rows):
            found = self._recall(self._key(feeds, row)) if self._capacity else None
            if found is None:
                if self._static is None:
                    raise NoDefaultAnswer("no earlier answer for this input and no static default configured")
                found = self._static
            answers.append(found)
        if not self._batched:
            return [np.array(out) for out in answers[0]]
        return [np.stack([a[i] for a in answers]) for i in range(len(answers[0]))]

    def _recall(self, key: bytes) -> list[Array] | None:
        with self._lock:
            found = self._memory.get(key)
            if found is not None:
                self._memory.move_to_end(key)
            return found

    def _key(self, feeds: Feeds, row: int) -> bytes:
        digest = hashlib.blake2b(digest_size=16)
        for name in self._input_names:
            array = feeds[name]
            part = array[row] if self._batched else array
            digest.update(f"{name}|{part.dtype.str}|{part.shape}|".encode())
            if part.dtype.kind == "O":
                digest.update(repr(part.tolist()).encode())
            else:
                digest.update(np.ascontiguousarray(part).tobytes())
        return digest.digest()


def _row_count(feeds: Feeds, names: list[str], batched: bool) -> int:
    return int(feeds[names[0]].shape[0]) if batched and names else 1


def _static_rows(
    config: DefaultAnswerConfig, outputs: tuple[TensorSpec, ...], batched: bool, where: str
) -> list[Array]:
    assert config.outputs is not None
    unknown = sorted(set(config.outputs) - {spec.name for spec in outputs})
    missing = [spec.name for spec in outputs if spec.name not in config.outputs]
    if unknown or missing:
        raise ConfigError(
            f"{where}: field fallback.default.outputs: needs exactly the outputs "
            f"{[s.name for s in outputs]} (unknown {unknown}, missing {missing})"
        )
    rows = []
    for spec in outputs:
        static = config.outputs[spec.name]
        graph_shape = spec.shape[1:] if batched else spec.shape
        shape = tuple(static.shape) if static.shape is not None else graph_shape
        if any(d < 0 for d in shape) or len(shape) != len(graph_shape):
            raise ConfigError(
                f"{where}: field fallback.default.outputs.{spec.name}.shape: give the row's shape "
                f"(the graph's is {list(graph_shape)})"
            )
        try:
            array = np.asarray(static.data, dtype=numpy_dtype(spec.datatype)).reshape(shape)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: field fallback.default.outputs.{spec.name}: {exc}") from None
        rows.append(array)
    return rows
