"""Where the running sequences' keys and values live, and how a step feeds them to the graph.

Two backends behind one face, chosen by the graph's layout:

- :class:`PooledBackend` for graphs whose attention is GroupQueryAttention with a shared
  past/present buffer (ortserve's own decoder builds, onnxruntime-genai's layout): rows live in
  a :class:`~ortserve.llm.kv_pool.KvPool`, each step writes its new tokens in place and reads
  each row only to its own length;
- :class:`PaddedBackend` for the Optimum layout (``present = Concat(past, new)``): the decode
  batch is left-padded to its longest row (:class:`~ortserve.llm.batch.DecodeBatch`).

Both prefill a prompt in chunks (a row at a time, its own length) and decode every activated
row in one run. The pool can also run the decode and one prompt's chunk as one run, when the
decoder has a step graph for that (:mod:`ortserve.llm.fused_graph`): the weights are read once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ortserve.llm.batch import DecodeBatch
from ortserve.llm.kv_pool import KvFull, KvPool
from ortserve.llm.layout import DecoderLayout
from ortserve.llm.sequence import Sequence

__all__ = [
    "DecoderSession",
    "KvBackend",
    "KvFull",
    "PaddedBackend",
    "PooledBackend",
    "StepFeeds",
    "fusing",
    "make_backend",
]

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


class DecoderSession:
    """Feeds an ONNX Runtime session in the Optimum or genai layout.

    Args:
        session: an ``onnxruntime.InferenceSession`` (typed loosely: its stubs are absent).
        layout: the graph's checked signature.
    """

    def __init__(self, session: object, layout: DecoderLayout) -> None:
        self.session = session
        self.layout = layout
        self.past_names = [
            f"past_key_values.{layer}.{part}" for layer in range(layout.layers) for part in ("key", "value")
        ]
        self.present_names = [
            f"present.{layer}.{part}" for layer in range(layout.layers) for part in ("key", "value")
        ]
        self.chunk_past_names = [name.replace("past_key_values", "chunk_past") for name in self.past_names]
        self.chunk_present_names = [f"chunk_{name}" for name in self.present_names]
        self.run_seconds = 0.0
        """Time spent inside ONNX Runtime's ``run`` (against the engine's step time: its overhead)."""
        self.fused: object | None = None
        """The decode-plus-chunk step graph's session on the same weights (the loader sets it
        when it could build one, :mod:`ortserve.llm.fusion`), else None."""

    @property
    def parts(self) -> int:
        return len(self.past_names)

    def empty_past(self, rows: int) -> list[F32]:
        shape = (rows, self.layout.kv_heads, 0, self.layout.head_dim)
        return [np.zeros(shape, dtype=np.float32) for _ in self.past_names]

    def run(self, ids: I64, positions: I64, mask: I64, past: list[F32]) -> tuple[F32, list[F32]]:
        """Logits of the last position of each row, and the present keys and values."""
        feeds: dict[str, object] = {"input_ids": ids, "attention_mask": mask}
        if self.layout.has_position_ids:
            feeds["position_ids"] = positions
        if self.layout.has_cache_branch:
            feeds["use_cache_branch"] = np.array([past[0].shape[2] > 0])
        feeds.update(zip(self.past_names, past))
        started = time.perf_counter()
        outputs = self.session.run(list(self.layout.output_names), feeds)  # type: ignore[attr-defined]
        self.run_seconds += time.perf_counter() - started
        return outputs[0][:, -1, :], list(outputs[1:])

    def run_in_place(self, ids: I64, positions: I64, lengths: list[int], buffers: list[F32]) -> F32:
        """Run with ``present`` bound to the very buffers fed as ``past`` (GroupQueryAttention
        writes the new tokens in place); rows are right-padded, row i holds ``lengths[i]``
        tokens after the run. Returns the last position's logits per row."""
        binding = _binding(self.session)
        feeds = StepFeeds(ids, positions, lengths, buffers)
        feeds.bind(binding, _PLAIN, self.past_names, self.present_names, self.layout.has_position_ids)
        logits = self._run_bound(self.session, binding)
        return logits[:, -1, :]

    def run_fused(self, decode: StepFeeds, chunk: StepFeeds) -> F32:
        """Decode rows and one prompt's chunk in one run of :attr:`fused`, keys and values
        written in place as :meth:`run_in_place` does. Returns the logits [rows + 1, vocab]:
        each decode row's, then the chunk's last token's.

        Raises:
            ValueError: no step graph, no decode row, or not one non-empty chunk row (ONNX
                Runtime's attention divides by the batch: a run with no row ends the process).
        """
        if self.fused is None or not len(decode.ids) or chunk.ids.shape[0] != 1 or not chunk.ids.size:
            raise ValueError("a fused step needs the step graph, decode rows and one non-empty chunk")
        binding = _binding(self.fused)
        decode.bind(binding, _PLAIN, self.past_names, self.present_names, True)
        chunk.bind(binding, _CHUNK, self.chunk_past_names, self.chunk_present_names, True)
        return self._run_bound(self.fused, binding)

    def _run_bound(self, session: object, binding: object) -> F32:
        started = time.perf_counter()
        session.run_with_iobinding(binding)  # type: ignore[attr-defined]
        self.run_seconds += time.perf_counter() - started
        logits: F32 = binding.get_outputs()[0].numpy()  # type: ignore[attr-defined]
        return logits


def _binding(session: object) -> object:
    """A fresh I/O binding with ``logits`` its first output (what ``get_outputs()[0]`` reads)."""
    binding = session.io_binding()  # type: ignore[attr-defined]
    binding.bind_output("logits")
    return binding


_PLAIN = ("input_ids", "position_ids", "attention_mask")
_CHUNK = ("chunk_ids", "chunk_position_ids", "chunk_attention_mask")


@dataclass(frozen=True, slots=True)
class StepFeeds:
    """Rows of one in-place run: token ids and positions [rows, tokens], each row's length
    after the run (rows right-padded), and the rows' pool buffers, bound as past and present."""

    ids: I64
    positions: I64
    lengths: list[int]
    buffers: list[F32]

    def bind(
        self,
        binding: object,
        names: tuple[str, str, str],
        past: list[str],
        present: list[str],
        positions: bool,
    ) -> None:
        import onnxruntime as ort  # the engine module stays importable without it

        width = max(self.lengths)
        mask = (np.arange(width)[None, :] < np.asarray(self.lengths)[:, None]).astype(np.int64)
        ids_name, positions_name, mask_name = names
        binding.bind_cpu_input(ids_name, self.ids)  # type: ignore[attr-defined]
        if positions:
            binding.bind_cpu_input(positions_name, self.positions)  # type: ignore[attr-defined]
        binding.bind_cpu_input(mask_name, mask)  # type: ignore[attr-defined]
        for past_name, present_name, buffer in zip(past, present, self.buffers, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(past_name, value)  # type: ignore[attr-defined]
            binding.bind_ortvalue_output(present_name, value)  # type: ignore[attr-defined]


class KvBackend(Protocol):
    """What the engine asks of the keys and values of its sequences."""

    decoder: DecoderSession

    @property
    def nbytes(self) -> int: ...

    def admit(self, sequence: Sequence, length: int) -> None:
        """Room for a new row that will hold ``length`` tokens (raises KvFull)."""

    def prefill(self, sequence: Sequence, start: int, stop: int, prefix: list[F32] | None) -> F32:
        """Compute tokens ``start .. stop-1`` of the sequence (``prefix``: its first ``start``
        tokens' keys and values, [kv, start, hd] per part, when it has none yet); logits of the
        last one."""

    def activate(self, sequence: Sequence) -> None:
        """The row is prefilled: it decodes from the next step on."""

    def fork(self, parent: Sequence, child: Sequence, length: int) -> None:
        """A new row holding a copy of ``parent``'s first ``length`` tokens (raises KvFull)."""

    def grow(self) -> None:
        """Room for one more token in every decoding row (raises KvFull)."""

    def decode(self) -> tuple[list[Sequence], F32]:
        """One token for every decoding row: the rows and their logits [rows, vocab]."""

    def release(self, sequence: Sequence) -> None: ...

    def read(self, sequence: Sequence, length: int) -> list[F32]:
        """A copy of the row's first ``length`` tokens' keys and values ([kv, length, hd])."""

    def decoding(self) -> list[Sequence]: ...


class PooledBackend:
    """Rows in a slot pool, written in place by GroupQueryAttention. A pool elsewhere than in
    host memory (``llm/device_kv.py``) changes the pool and :meth:`_run` only."""

    cuda_graph = False
    """Decode steps run as captured graphs (fixed shapes and addresses; a device pool's)."""

    def __init__(self, decoder: DecoderSession, max_len: int, budget_bytes: int) -> None:
        layout = decoder.layout
        self.decoder = decoder
        self.pool = KvPool(decoder.parts, layout.kv_heads, layout.head_dim, max_len, budget_bytes)

    def _run(self, ids: I64, positions: I64, lengths: list[int], start: int, rows: int, graph: bool) -> F32:
        """One step over the pool's rows ``start .. start+rows-1`` (``graph``: a captured decode)."""
        return self.decoder.run_in_place(ids, positions, lengths, self.pool.view(start, start + rows))

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes

    def admit(self, sequence: Sequence, length: int) -> None:
        self.pool.take(sequence, length)

    def prefill(self, sequence: Sequence, start: int, stop: int, prefix: list[F32] | None) -> F32:
        pool = self.pool
        pool.reserve(len(pool), stop)
        if prefix is not None:
            pool.write(sequence, prefix, start)
        index = pool.slot(sequence)
        ids = np.array([sequence.tokens[start:stop]], dtype=np.int64)
        positions = np.arange(start, stop, dtype=np.int64)[None]
        logits = self._run(ids, positions, [stop], index, 1, graph=False)
        pool.set_length(sequence, stop)
        row: F32 = logits[0]
        return row

    def activate(self, sequence: Sequence) -> None:
        self.pool.activate(sequence)

    def fork(self, parent: Sequence, child: Sequence, length: int) -> None:
        pool = self.pool
        pool.take(child, length)
        pool.copy_row(pool.slot(parent), pool.slot(child), length)
        pool.set_length(child, length)

    def grow(self) -> None:
        pool = self.pool
        if pool.decoding:
            pool.reserve(len(pool), max(pool.lengths[: pool.decoding]) + 1)

    def decode(self) -> tuple[list[Sequence], F32]:
        pool = self.pool
        rows: list[Sequence] = pool.owners(0, pool.decoding)  # type: ignore[assignment]
        ids, positions, lengths = _decode_feeds(rows)
        logits = self._run(ids, positions, lengths, 0, len(rows), graph=self.cuda_graph)
        for sequence, length in zip(rows, lengths, strict=True):
            pool.set_length(sequence, length)
        return rows, logits

    def decode_with_chunk(
        self, sequence: Sequence, start: int, stop: int, prefix: list[F32] | None
    ) -> tuple[list[Sequence], F32, F32]:
        """:meth:`decode` and :meth:`prefill` of ``sequence``'s tokens ``start .. stop-1`` as
        one run: the decoding rows, their logits, and the chunk's last token's logits.

        Raises:
            KvFull: no room for the chunk (before anything ran).
            ValueError: the sequence decodes already (its rows cannot be bound twice).
        """
        pool = self.pool
        index = pool.slot(sequence)
        if index < pool.decoding:  # its row would be bound twice, as decode and as chunk
            raise ValueError("the chunk's sequence is decoding")
        pool.reserve(len(pool), stop)
        if prefix is not None:
            pool.write(sequence, prefix, start)
        rows: list[Sequence] = pool.owners(0, pool.decoding)  # type: ignore[assignment]
        ids, positions, lengths = _decode_feeds(rows)
        chunk = StepFeeds(
            np.array([sequence.tokens[start:stop]], dtype=np.int64),
            np.arange(start, stop, dtype=np.int64)[None],
            [stop],
            pool.view(index, index + 1),
        )
        logits = self.decoder.run_fused(StepFeeds(ids, positions, lengths, pool.view(0, len(rows))), chunk)
        for row, length in zip(rows, lengths, strict=True):
            pool.set_length(row, length)
        pool.set_length(sequence, stop)
        return rows, logits[:-1], logits[-1]

    def release(self, sequence: Sequence) -> None:
        if sequence in self.pool:
            self.pool.release(sequence)

    def read(self, sequence: Sequence, length: int) -> list[F32]:
        return self.pool.read(sequence, length)

    def decoding(self) -> list[Sequence]:
        return self.pool.owners(0, self.pool.decoding)  # type: ignore[return-value]


def _decode_feeds(rows: list[Sequence]) -> tuple[I64, I64, list[int]]:
    """Each decoding row's last token, its position, and its length after the step."""
    ids = np.array([[s.last_token] for s in rows], dtype=np.int64)
    positions = np.array([[s.length - 1] for s in rows], dtype=np.int64)
    return ids, positions, [s.length for s in rows]


class PaddedBackend:
    """The Optimum layout: a left-padded decode batch, and each prefilling row's own cache."""

    def __init__(self, decoder: DecoderSession, max_len: int, budget_bytes: int) -> None:
        layout = decoder.layout
        self.decoder = decoder
        self.batch = DecodeBatch(decoder.parts, layout.kv_heads, layout.head_dim)
        self.token_bytes = decoder.parts * layout.kv_heads * layout.head_dim * 4
        self.budget_bytes = budget_bytes
        self.max_len = max_len
        self._own: dict[Sequence, list[F32]] = {}
        self._joining: list[Sequence] = []
        """Prefilled rows that join the batch at the next decode, all in one rebuild."""

    @property
    def nbytes(self) -> int:
        return self.batch.nbytes + sum(sum(p.nbytes for p in kv) for kv in self._own.values())

    def _check(self, rows: int, columns: int) -> None:
        if columns > self.max_len or rows * columns * self.token_bytes > self.budget_bytes:
            raise KvFull(f"{rows} padded rows of {columns} tokens exceed the keys and values budget")

    def admit(self, sequence: Sequence, length: int) -> None:
        self._check(len(self.batch) + len(self._own) + 1, max(self.batch.columns + 1, length))
        self._own[sequence] = self.decoder.empty_past(1)

    def prefill(self, sequence: Sequence, start: int, stop: int, prefix: list[F32] | None) -> F32:
        past = [p[None] for p in prefix] if prefix is not None else self._own[sequence]
        ids = np.array([sequence.tokens[start:stop]], dtype=np.int64)
        positions = np.arange(start, stop, dtype=np.int64)[None]
        logits, present = self.decoder.run(ids, positions, np.ones((1, stop), dtype=np.int64), past)
        self._own[sequence] = present
        row: F32 = logits[0]
        return row

    def activate(self, sequence: Sequence) -> None:
        self._joining.append(sequence)

    def fork(self, parent: Sequence, child: Sequence, length: int) -> None:
        self.admit(child, length)
        self._own[child] = [part.copy() for part in self._own[parent]]

    def grow(self) -> None:
        longest = max([self.batch.columns] + [self._own[s][0].shape[2] for s in self._joining])
        self._check(len(self.batch) + len(self._own), longest + 1)

    def decode(self) -> tuple[list[Sequence], F32]:
        if self._joining:
            self.batch.join([(s, self._own.pop(s)) for s in self._joining])
            self._joining.clear()
        ids, positions, mask = self.batch.feeds()
        logits, present = self.decoder.run(ids, positions, mask, self.batch.kv)
        self.batch.advance(present, mask)
        return list(self.batch.rows), logits

    def release(self, sequence: Sequence) -> None:
        if sequence in self._joining:
            self._joining.remove(sequence)
        if self._own.pop(sequence, None) is not None:
            return
        if sequence in self.batch.rows:
            self.batch.keep([i for i, s in enumerate(self.batch.rows) if s is not sequence])

    def read(self, sequence: Sequence, length: int) -> list[F32]:
        own = self._own.get(sequence)
        if own is not None:
            return [np.ascontiguousarray(p[0, :, :length]) for p in own]
        kv = self.batch.row_kv(self.batch.rows.index(sequence))
        return [np.ascontiguousarray(p[:, :length]) for p in kv]

    def decoding(self) -> list[Sequence]:
        return list(self.batch.rows) + self._joining


def fusing(backend: KvBackend) -> PooledBackend | None:
    """``backend`` when it can run a step's decode and a prompt chunk as one
    (:meth:`PooledBackend.decode_with_chunk`): the decoder has a step graph and the pool is in
    host memory; else None."""
    if (
        isinstance(backend, PooledBackend)
        and backend.decoder.fused is not None
        and type(backend.pool) is KvPool
    ):
        return backend
    return None


def make_backend(decoder: DecoderSession, max_len: int, budget_bytes: int) -> KvBackend:
    """The pool for graphs that write keys and values in place (on the device when the session's
    first provider is CUDA or TensorRT: llm/device_kv.py), the padded batch otherwise."""
    if decoder.layout.shared_buffer:
        from ortserve.llm.device_kv import device_backend  # it imports this module

        return device_backend(decoder, max_len, budget_bytes) or PooledBackend(decoder, max_len, budget_bytes)
    return PaddedBackend(decoder, max_len, budget_bytes)
