"""TensorRT options a model gets unless its config says otherwise: keyed caches and profiles.

TensorRT builds an engine per input-shape profile, minutes for a large graph. Built lazily it
would happen on the first request of each new shape, after the version reported READY; so
the engine is built during warm-up (which runs every configured batch size before READY) and
kept in a cache that later loads, restarts and ``--workers`` copies reuse. A cache is only
valid for the GPU model, TensorRT version and graph it was built from, so its folder is named
by all three: a new driver stack or a changed model never loads a stale engine.

Profiles come from the model's batch sizes: one per range between preferred sizes, each
optimised for its upper end, so a batch of 8 does not run an engine tuned for 64.

INT8: a calibration table beside the model (``calibration.flatbuffers``, written by
``ortserve quantize --trt-int8-calibration``) turns on ``trt_int8_enable`` with that table,
copied into the engine cache folder (the provider reads it from there), in a subfolder named by
the table's digest: a new table builds a new engine.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "InputShape",
    "cache_folder",
    "gpu_name",
    "graph_inputs",
    "installed_tensorrt",
    "int8_table",
    "model_digest",
    "profile_ranges",
    "tensorrt_options",
]

INT8_TABLE = "calibration.flatbuffers"

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class InputShape:
    """An input as the graph declares it: dims are ints, or None where symbolic."""

    name: str
    dims: tuple[int | None, ...]


def model_digest(parts: Iterable[bytes | memoryview]) -> str:
    """SHA-256 over the graph and its external data, in the order given."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def cache_folder(root: Path, gpu: str, trt_version: str, digest: str) -> Path:
    """``root/<gpu>-trt<version>/<digest[:16]>``: one folder per GPU model, TensorRT and graph."""
    device = _SAFE.sub("_", f"{gpu}-trt{trt_version}").strip("_") or "unknown"
    return root / device / digest[:16]


def profile_ranges(max_batch: int, preferred: Sequence[int]) -> list[tuple[int, int]]:
    """(min, max) batch ranges, one per profile, covering 1..max_batch; each range's optimum is
    its max. Preferred sizes above ``max_batch`` are ignored."""
    if max_batch < 1:
        return [(1, 1)]
    edges = sorted({size for size in preferred if 1 <= size < max_batch} | {max_batch})
    ranges, low = [], 1
    for edge in edges:
        ranges.append((low, edge))
        low = edge + 1
    return ranges


def _shape(name: str, dims: tuple[int | None, ...], batch: int) -> str:
    return f"{name}:" + "x".join(str(batch if index == 0 else dim) for index, dim in enumerate(dims))


def tensorrt_options(
    user: dict[str, str],
    inputs: Sequence[InputShape],
    max_batch: int,
    preferred: Sequence[int],
    folder: Path,
    calibration: Path | None = None,
) -> dict[str, str]:
    """The options for TensorRT: the user's, completed with caches in ``folder`` and profiles.

    Profiles are only set when every input's dims past the batch are fixed (TensorRT needs
    every dim in a profile) and the user set none; the user's cache paths and switches win.
    ``calibration``: an INT8 table (see :func:`int8_table`); INT8 is used unless the user's
    ``trt_int8_enable`` says false.
    """
    options = dict(user)
    if calibration is not None and options.get("trt_int8_enable", "True").lower() in ("1", "true"):
        folder = folder / f"int8-{model_digest([calibration.read_bytes()])[:12]}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(calibration, folder / calibration.name)
        options["trt_int8_enable"] = "True"
        options.setdefault("trt_int8_calibration_table_name", calibration.name)
        options.setdefault("trt_int8_use_native_calibration_table", "False")
    options.setdefault("trt_engine_cache_enable", "True")
    options.setdefault("trt_engine_cache_path", str(folder))
    options.setdefault("trt_timing_cache_enable", "True")
    options.setdefault("trt_timing_cache_path", str(folder.parent))
    profiled = any(key.startswith("trt_profile_") for key in user)
    fixed = all(dims and all(dim is not None for dim in dims[1:]) for dims in (arg.dims for arg in inputs))
    if max_batch >= 1 and inputs and fixed and not profiled:
        ranges = profile_ranges(max_batch, preferred)
        options["trt_profile_min_shapes"] = ",".join(
            _shape(arg.name, arg.dims, low) for low, _ in ranges for arg in inputs
        )
        options["trt_profile_max_shapes"] = ",".join(
            _shape(arg.name, arg.dims, high) for _, high in ranges for arg in inputs
        )
        options["trt_profile_opt_shapes"] = options["trt_profile_max_shapes"]
    return options


def int8_table(model_dir: Path) -> Path | None:
    """The INT8 calibration table beside a model, if one was written there."""
    table = model_dir / INT8_TABLE
    return table if table.is_file() else None


def graph_inputs(graph: bytes) -> list[InputShape]:
    """The graph's real inputs (initializers excluded) with their declared dims."""
    import onnx  # only a TensorRT session pays for it: onnx is kept off the serving path

    model = onnx.ModelProto.FromString(graph)  # external data stays unread: only inputs are wanted
    initialized = {init.name for init in model.graph.initializer}
    shapes = []
    for value in model.graph.input:
        if value.name in initialized:
            continue
        dims = value.type.tensor_type.shape.dim
        shapes.append(
            InputShape(value.name, tuple(d.dim_value if d.HasField("dim_value") else None for d in dims))
        )
    return shapes


def installed_tensorrt() -> str:
    """The TensorRT version importable here (the Python package ships the libraries ONNX
    Runtime loads), or ``unknown``."""
    try:
        import tensorrt  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return "unknown"
    return str(getattr(tensorrt, "__version__", "unknown"))


def gpu_name(device_id: int) -> str:
    """The GPU's product name through NVML, or ``gpu<N>`` where NVML is not installed."""
    try:
        import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(device_id))
    except Exception:  # NVML absent or failing: the folder is still per device index
        return f"gpu{device_id}"
    return name.decode() if isinstance(name, bytes) else str(name)
