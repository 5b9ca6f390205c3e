"""The running decode batch: its sequences and their keys and values in one tensor per layer.

Rows are aligned on the right: every step appends one column for every row, a row that joined
with a shorter history is masked on its left, and the columns no remaining row uses are cut
when rows leave. The batch's tensors are the previous step's ``present`` outputs, fed back as
``past_key_values`` without a copy; a copy happens only when rows join or leave.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ortserve.llm.sequence import Sequence

__all__ = ["DecodeBatch"]

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


class DecodeBatch:
    """Sequences decoding together.

    Args:
        parts: number of key/value tensors (2 per layer).
        kv_heads: key/value heads.
        head_dim: size of one head.
    """

    def __init__(self, parts: int, kv_heads: int, head_dim: int) -> None:
        self._parts = parts
        self._kv_heads = kv_heads
        self._head_dim = head_dim
        self.rows: list[Sequence] = []
        self.kv: list[F32] = []
        self.mask: I64 = np.zeros((0, 0), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.kv)

    def join(self, joining: list[tuple[Sequence, list[F32]]]) -> None:
        """Add sequences with their prefilled keys and values ([1, kv, length, hd] per part)."""
        if not joining:
            return
        width = max([self.columns] + [kv[0].shape[2] for _, kv in joining])
        rows = len(self.rows) + len(joining)
        mask = np.zeros((rows, width), dtype=np.int64)
        mask[: len(self.rows), width - self.columns :] = self.mask
        merged = []
        for part in range(self._parts):
            out = np.zeros((rows, self._kv_heads, width, self._head_dim), dtype=np.float32)
            if self.rows:
                out[: len(self.rows), :, width - self.columns :] = self.kv[part]
            for i, (_, kv) in enumerate(joining):
                out[len(self.rows) + i, :, width - kv[part].shape[2] :] = kv[part][0]
            merged.append(out)
        for i, (_, kv) in enumerate(joining):
            mask[len(self.rows) + i, width - kv[0].shape[2] :] = 1
        self.rows.extend(sequence for sequence, _ in joining)
        self.kv, self.mask = merged, mask

    def feeds(self) -> tuple[I64, I64, I64]:
        """input_ids, position_ids [B, 1] and the attention mask [B, columns + 1] of the next step."""
        ids = np.array([[s.last_token] for s in self.rows], dtype=np.int64)
        positions = np.array([[s.length - 1] for s in self.rows], dtype=np.int64)
        mask = np.concatenate([self.mask, np.ones((len(self.rows), 1), dtype=np.int64)], axis=1)
        return ids, positions, mask

    def advance(self, present: list[F32], mask: I64) -> None:
        """The step ran: its outputs are the batch's keys and values now."""
        self.kv, self.mask = present, mask

    def row_kv(self, index: int) -> list[F32]:
        """One row's keys and values without the masked columns ([kv, length, hd] per part)."""
        used = self.mask[index].astype(bool)
        return [np.ascontiguousarray(part[index][:, used]) for part in self.kv]

    def keep(self, kept: list[int]) -> None:
        """Keep only the rows at ``kept`` and cut the columns none of them uses."""
        if len(kept) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in kept]
        if not kept:
            self.kv, self.mask = [], np.zeros((0, 0), dtype=np.int64)
            return
        index = np.array(kept, dtype=np.int64)
        mask = self.mask[index]
        used = np.flatnonzero(mask.any(axis=0))
        first = int(used[0]) if used.size else mask.shape[1]
        self.mask = np.ascontiguousarray(mask[:, first:])
        self.kv = [part[index, :, first:] for part in self.kv]
