"""The LLM's keys and values on the device: a slot pool of ONNX Runtime tensors bound by pointer.

On a CUDA session, :class:`~ortserve.llm.kv_backend.PooledBackend` would hand ONNX Runtime host
buffers, which it copies to the device and back at every step: the whole cache across PCIe per
token. :class:`DevicePooledBackend` keeps the pool in device ``OrtValue`` s instead, one per layer
and part, ``[slots, kv_heads, capacity, head_dim]``, and binds ``past`` and ``present`` of a
step to the same device address (GroupQueryAttention writes the new tokens in place); token
ids, positions and the mask go in from the host and the logits come back to it, nothing else
crosses. Moving rows (a row leaving, a growth, a fork, the prefix cache's reads and writes) is
done with device-to-device copies (``cudaMemcpy2D``, one per buffer) through
:mod:`ortserve.core.cuda_ipc`.

The same code runs on ``cpu`` OrtValues with host ``memmove`` s (tests/llm/test_device_kv.py
checks its greedy tokens against the host pool's); the server takes this path only when the
LLM session's first provider is CUDA (or TensorRT).

CUDA graphs (``llm.enable_cuda_graph: true`` in the model's config, or ``enable_cuda_graph`` in
the CUDA provider's options): ONNX Runtime replays a
captured graph only when every input and output is bound at the same address with the same
shape as at capture. With ``fixed_shapes`` the pool is allocated once at its full size (never
reallocated, so addresses hold), the mask is padded to the pool's capacity (its width is then
fixed; the graph computes ``seqlens_k`` from its sum, so right padding with zeros changes
nothing, which the tests check) and each decode row count gets its own staging tensors and
``gpu_graph_id`` run option. Prefill chunks (any length) run without a graph. See
docs/device.md for the limits.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ortserve.core.binding import DeviceSpec
from ortserve.core.cuda_ipc import HostMemory, MemoryOps
from ortserve.core.session import SessionPlan
from ortserve.llm.kv_backend import DecoderSession, KvFull, PooledBackend
from ortserve.llm.kv_pool import KvPool

__all__ = [
    "DeviceKvPool",
    "DevicePooledBackend",
    "cuda_graph_enabled",
    "device_backend",
    "memory_for",
    "with_cuda_graph",
]

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
_ITEM = 4  # float32


def memory_for(device: DeviceSpec) -> MemoryOps:
    """The copies for a device's pointers: host ``memmove`` for ``cpu``, CUDA otherwise."""
    if device.kind == "cpu":
        return HostMemory()
    from ortserve.core.cuda_ipc import cuda_runtime

    runtime = cuda_runtime()
    runtime.set_device(device.index)
    return runtime


def cuda_graph_enabled(session: object) -> bool:
    """Whether the session's CUDA provider was given ``enable_cuda_graph``."""
    options = session.get_provider_options().get("CUDAExecutionProvider", {})  # type: ignore[attr-defined]
    return str(options.get("enable_cuda_graph", "0")).lower() in ("1", "true")


class DeviceKvPool(KvPool):
    """:class:`KvPool`'s slot bookkeeping over device tensors (``values``), moved by pointer.

    ``buffers`` stays empty: nothing of the pool lives on the host.
    """

    def __init__(
        self,
        parts: int,
        kv_heads: int,
        head_dim: int,
        max_len: int,
        budget_bytes: int,
        device: DeviceSpec,
        memory: MemoryOps,
        allocate: Callable[[tuple[int, ...], DeviceSpec], Any],
        fixed: bool = False,
    ) -> None:
        super().__init__(parts, kv_heads, head_dim, max_len, budget_bytes)
        self.device = device
        self.memory = memory
        self._allocate = allocate
        self.values: list[Any] = []
        self._scratch: Any = None
        self.fixed = fixed
        """Allocate the whole budget once and never move (CUDA graphs need fixed addresses)."""

    # -- geometry ------------------------------------------------------------------
    def _row_bytes(self) -> int:
        return self.capacity * self.head_dim * _ITEM

    def _slot_bytes(self) -> int:
        return self.kv_heads * self._row_bytes()

    def pointer(self, part: int, slot: int = 0) -> int:
        return int(self.values[part].data_ptr()) + slot * self._slot_bytes()

    def shape(self, rows: int) -> list[int]:
        return [rows, self.kv_heads, self.capacity, self.head_dim]

    # -- storage -------------------------------------------------------------------
    def reserve(self, rows: int, length: int) -> None:
        if self.fixed and not self.values:
            self._allocate_all()
        if self.fixed:
            if length > self.max_len:
                raise KvFull(f"{length} tokens exceed the context of {self.max_len}")
            if rows > self.slots or length > self.capacity:
                raise KvFull(f"{rows} rows of {length} tokens exceed the fixed pool of {self.slots} slots")
            return
        super().reserve(rows, length)

    def _allocate_all(self) -> None:
        """Fixed mode: every slot the budget holds, each of the whole context."""
        capacity = -(-self.max_len // 64) * 64
        slots = self.budget_bytes // self.bytes_for(1, capacity)
        if slots < 1:
            raise KvFull(f"the keys and values budget {self.budget_bytes} holds no row of {capacity} tokens")
        self._reallocate(slots, capacity)

    def _reallocate(self, slots: int, capacity: int) -> None:
        used, held = len(self._owners), self.longest()
        old, old_row = self.values, self._row_bytes()
        shape = (slots, self.kv_heads, capacity, self.head_dim)
        fresh = [self._allocate(shape, self.device) for _ in range(self.parts)]
        if old and used and held:
            for source, target in zip(old, fresh, strict=True):
                self.memory.copy_2d(
                    int(target.data_ptr()),
                    capacity * self.head_dim * _ITEM,
                    int(source.data_ptr()),
                    old_row,
                    held * self.head_dim * _ITEM,
                    used * self.kv_heads,
                )
        self.values, self.slots, self.capacity = fresh, slots, capacity
        self._scratch = None
        self.generation += 1

    def release(self, owner: object) -> None:
        slots, capacity = self.slots, self.capacity
        super().release(owner)
        if self._owners:
            return
        if self.fixed:  # the pool stays allocated where it is: captured graphs point into it
            self.slots, self.capacity = slots, capacity
        else:
            self.values, self._scratch = [], None

    def _copy_row(self, source: int, target: int, length: int, part: int) -> None:
        """Tokens ``0 .. length-1`` of slot ``source`` onto slot ``target`` (one buffer)."""
        if length:
            row = self._row_bytes()
            self.memory.copy_2d(
                self.pointer(part, target),
                row,
                self.pointer(part, source),
                row,
                length * self.head_dim * _ITEM,
                self.kv_heads,
            )

    def copy_row(self, source: int, target: int, length: int) -> None:
        for part in range(self.parts):
            self._copy_row(source, target, length, part)

    def _swap(self, a: int, b: int) -> None:
        if a == b:
            return
        la, lb = self.lengths[a], self.lengths[b]
        if self._scratch is None:
            self._scratch = self._allocate((1, self.kv_heads, self.capacity, self.head_dim), self.device)
        scratch, row = int(self._scratch.data_ptr()), self._row_bytes()
        for part in range(self.parts):
            if la:
                self.memory.copy_2d(
                    scratch, row, self.pointer(part, a), row, la * self.head_dim * _ITEM, self.kv_heads
                )
            self._copy_row(b, a, lb, part)
            if la:
                self.memory.copy_2d(
                    self.pointer(part, b), row, scratch, row, la * self.head_dim * _ITEM, self.kv_heads
                )
        self._owners[a], self._owners[b] = self._owners[b], self._owners[a]
        self.lengths[a], self.lengths[b] = lb, la
        self._index[self._owners[a]] = a
        self._index[self._owners[b]] = b

    def write(self, owner: object, kv: list[F32], length: int) -> None:
        index = self._index[owner]
        row = self._row_bytes()
        for part, values in enumerate(kv):
            host = np.ascontiguousarray(values[:, :length], dtype=np.float32)
            for head in range(self.kv_heads):
                self.memory.copy_from_host(
                    self.pointer(part, index) + head * row, int(host[head].ctypes.data), host[head].nbytes
                )
        self.lengths[index] = length

    def read(self, owner: object, length: int) -> list[F32]:
        index = self._index[owner]
        row = self._row_bytes()
        parts = []
        for part in range(self.parts):
            host = np.empty((self.kv_heads, length, self.head_dim), dtype=np.float32)
            for head in range(self.kv_heads):
                self.memory.copy_to_host(
                    int(host[head].ctypes.data), self.pointer(part, index) + head * row, host[head].nbytes
                )
            parts.append(host)
        return parts

    def view(self, start: int, stop: int) -> list[F32]:
        raise TypeError("a device pool has no host view: bind it by pointer (DevicePooledBackend)")


def _ortvalue(shape: tuple[int, ...], device: DeviceSpec) -> Any:
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), np.float32, device.kind, device.index)


class DevicePooledBackend(PooledBackend):
    """:class:`~ortserve.llm.kv_backend.PooledBackend` with the pool on ``device``.

    Args:
        decoder: the session, in the genai layout (shared past/present buffer).
        max_len: the context.
        budget_bytes: the pool's device bytes at most.
        device: where the pool lives (``cuda``; ``cpu`` in tests).
        memory: the copies for that device's pointers (default: :func:`memory_for`).
        cuda_graph: fixed shapes and addresses for decode steps, one graph per row count.
    """

    pool: DeviceKvPool

    def __init__(
        self,
        decoder: DecoderSession,
        max_len: int,
        budget_bytes: int,
        device: DeviceSpec,
        memory: MemoryOps | None = None,
        cuda_graph: bool = False,
    ) -> None:
        layout = decoder.layout  # PooledBackend.__init__ is not called: no host pool is wanted
        self.decoder = decoder
        self.device = device
        self.cuda_graph = cuda_graph
        self.pool = DeviceKvPool(
            decoder.parts,
            layout.kv_heads,
            layout.head_dim,
            max_len,
            budget_bytes,
            device,
            memory if memory is not None else memory_for(device),
            _ortvalue,
            fixed=cuda_graph,
        )
        self._graphs: dict[int, tuple[Any, Any, Any, Any]] = {}
        self._vocab = 0
        if cuda_graph:
            vocab = decoder.session.get_outputs()[0].shape[-1]  # type: ignore[attr-defined]
            if not isinstance(vocab, int):
                raise ValueError("CUDA graphs need the logits' vocabulary dimension fixed in the graph")
            self._vocab = vocab
        """Per decode row count (graph mode): staging ids, positions, mask, and logits tensors."""

    def _run(self, ids: I64, positions: I64, lengths: list[int], start: int, rows: int, graph: bool) -> F32:
        import onnxruntime as ort

        decoder, pool, layout = self.decoder, self.pool, self.decoder.layout
        session: Any = decoder.session
        binding = session.io_binding()
        width = pool.capacity if graph else max(lengths)
        mask = (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
        options = None
        if graph:
            staged = self._staging(rows, width)
            for value, host in zip(staged[:3], (ids, positions, mask), strict=True):
                value.update_inplace(np.ascontiguousarray(host))
            binding.bind_ortvalue_input("input_ids", staged[0])
            if layout.has_position_ids:
                binding.bind_ortvalue_input("position_ids", staged[1])
            binding.bind_ortvalue_input("attention_mask", staged[2])
            binding.bind_ortvalue_output("logits", staged[3])
            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(rows))
        else:
            if self.cuda_graph:  # a prefill chunk (any length) is never captured
                options = ort.RunOptions()
                options.add_run_config_entry("gpu_graph_id", "-1")
            binding.bind_cpu_input("input_ids", ids)
            if layout.has_position_ids:
                binding.bind_cpu_input("position_ids", positions)
            binding.bind_cpu_input("attention_mask", mask)
            binding.bind_output("logits", "cpu")  # only the logits come back across PCIe
        shape = pool.shape(rows)
        for part, (past, present) in enumerate(zip(decoder.past_names, decoder.present_names, strict=True)):
            pointer = pool.pointer(part, start)
            binding.bind_input(past, self.device.kind, self.device.index, np.float32, shape, pointer)
            binding.bind_output(present, self.device.kind, self.device.index, np.float32, shape, pointer)
        began = time.perf_counter()
        session.run_with_iobinding(binding, options)
        decoder.run_seconds += time.perf_counter() - began
        logits: F32 = self._graphs[rows][3].numpy() if graph else binding.get_outputs()[0].numpy()
        return logits[:, -1, :]

    def _staging(self, rows: int, width: int) -> tuple[Any, Any, Any, Any]:
        import onnxruntime as ort

        staged = self._graphs.get(rows)
        if staged is None:
            kind, index = self.device.kind, self.device.index
            vocab = self._vocab

            def tensor(shape: list[int], dtype: type) -> Any:
                return ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, kind, index)

            staged = (
                tensor([rows, 1], np.int64),
                tensor([rows, 1], np.int64),
                tensor([rows, width], np.int64),
                tensor([rows, 1, vocab], np.float32),
            )
            self._graphs[rows] = staged
        return staged


def device_backend(decoder: DecoderSession, max_len: int, budget_bytes: int) -> DevicePooledBackend | None:
    """The device backend when the session's first provider keeps tensors on a device (CUDA,
    TensorRT), else None (the host pool serves)."""
    from ortserve.core.binding import binding_device

    session: Any = decoder.session
    if not hasattr(session, "get_provider_options"):
        return None
    device = binding_device(session)
    if device is None:
        return None
    return DevicePooledBackend(decoder, max_len, budget_bytes, device, cuda_graph=cuda_graph_enabled(session))


def with_cuda_graph(plan: SessionPlan, enabled: bool) -> SessionPlan:
    """The plan with ``enable_cuda_graph`` in the CUDA provider's options when the LLM config
    asks for it (``llm.enable_cuda_graph``); an option the model's own provider list sets wins."""
    if not enabled:
        return plan
    providers = tuple(
        (name, {"enable_cuda_graph": "1", **options} if name == "CUDAExecutionProvider" else options)
        for name, options in plan.providers
    )
    return dataclasses.replace(plan, providers=providers)
