"""What a config.pbtxt means beyond its field names, as Triton's ONNX Runtime backend reads it.

- Stateful (``sequence_batching``) and decoupled (``model_transaction_policy.decoupled``) models
  are refused: served as stateless, one-answer models they would answer wrong, not fail.
- ``optimization.graph.level`` maps as the backend maps it: -1 basic, 1 extended, 2 disabled,
  0 (or none) all.
- ``execution_mode`` (parameter, "0" sequential, Triton's default, or "1" parallel) with
  ``inter_op_thread_count``: ortserve runs ORT_PARALLEL exactly when it has more than one
  inter-op thread, so parallel takes ``inter_op_thread_count`` (2 when not given or 0) and
  sequential one thread (a count given with it has no effect, as in Triton, and is said so).
- A thread count of "0" is ONNX Runtime's default, as in Triton (not an error).
- ``max_batch_size`` 0 or absent: Triton's auto-complete lets a model batch when its first
  dimension is dynamic; ortserve does the same when the file declares no tensors (with its own
  default limit, 32, where Triton's ``default-max-batch-size`` is 4). Tensors declared with
  ``max_batch_size`` 0 are whole shapes: the model does not batch.
- ``dynamic_batching { }`` is supported (it is batching with Triton's default delay of 0);
  it is said to have no effect only when the model does not batch.
"""

from __future__ import annotations

from typing import Any

from ortserve.errors import ConfigError
from ortserve.protocol.grpc import model_config_pb2 as mc

__all__ = [
    "GRAPH_LEVELS",
    "HANDLED_PARAMETERS",
    "batch_limit",
    "batching_notes",
    "check_stateless",
    "graph_level",
    "thread_fields",
]

GRAPH_LEVELS = {-1: "basic", 0: "all", 1: "extended", 2: "disabled"}
"""Triton's ``optimization.graph.level`` to config.yaml's ``graph_optimization_level``."""
_THREADS = {"intra_op_thread_count": "intra_op_threads", "inter_op_thread_count": "inter_op_threads"}
HANDLED_PARAMETERS = frozenset({*_THREADS, "execution_mode"})
"""``parameters`` keys this module reads (no "not supported" warning for them)."""
_PARALLEL_DEFAULT_THREADS = 2


def check_stateless(message: mc.ModelConfig, where: str) -> None:
    """Raises: ConfigError for a stateful or decoupled model, saying why it cannot be served."""
    if message.WhichOneof("scheduling_choice") == "sequence_batching":
        raise ConfigError(
            f"{where}: sequence_batching: this is a stateful model (the requests of a sequence share "
            "state); ortserve serves stateless models only, and serving it as one would answer each "
            "request without its sequence's state"
        )
    if message.model_transaction_policy.decoupled:
        raise ConfigError(
            f"{where}: model_transaction_policy.decoupled: ortserve answers each request with exactly "
            "one response; decoupled models (zero or many responses per request) are not supported"
        )


def graph_level(message: mc.ModelConfig, where: str) -> str | None:
    """config.yaml's ``graph_optimization_level`` for ``optimization.graph.level`` (None: unset).

    Raises:
        ConfigError: a level Triton does not define.
    """
    if not message.optimization.HasField("graph"):
        return None
    level = message.optimization.graph.level
    if level not in GRAPH_LEVELS:
        raise ConfigError(
            f"{where}: field optimization.graph.level: {level} is not one of -1 (basic), 0 (all), "
            "1 (extended), 2 (disabled)"
        )
    return GRAPH_LEVELS[level]


def thread_fields(message: mc.ModelConfig, where: str) -> tuple[dict[str, Any], list[str]]:
    """config.yaml's thread counts from the thread and ``execution_mode`` parameters, and the
    notes to warn about (a count that has no effect).

    Raises:
        ConfigError: a count that is not a non-negative integer, or an unknown execution mode.
    """
    fields: dict[str, Any] = {}
    for key, field in _THREADS.items():
        if key in message.parameters:
            count = _count(message, key, where)
            if count:  # 0: ONNX Runtime's default
                fields[field] = count
    notes: list[str] = []
    mode = "0"
    if "execution_mode" in message.parameters:
        mode = message.parameters["execution_mode"].string_value.strip()
    if mode == "1":
        fields["inter_op_threads"] = max(fields.get("inter_op_threads", 0), _PARALLEL_DEFAULT_THREADS)
    elif mode == "0":
        given = fields.pop("inter_op_threads", None)
        if given is not None and given > 1:
            notes.append(
                f"parameters.inter_op_thread_count={given} (no effect in sequential execution; "
                'set parameters.execution_mode "1" for parallel)'
            )
        if given is not None:
            fields["inter_op_threads"] = 1
    else:
        raise ConfigError(f"{where}: field parameters.execution_mode: {mode!r} is not 0 or 1")
    return fields, notes


def batch_limit(message: mc.ModelConfig) -> int | None:
    """config.yaml's ``batching.max_batch_size`` (None: ortserve decides from the graph)."""
    if message.max_batch_size > 0:
        return message.max_batch_size
    if message.max_batch_size == 0 and not message.input and not message.output:
        return None  # auto-complete: batching when the first dimension is dynamic
    return 0


def batching_notes(message: mc.ModelConfig) -> list[str]:
    """Batching fields set that have no effect (for the file's one warning)."""
    if message.HasField("dynamic_batching") and batch_limit(message) == 0:
        return ["dynamic_batching (no effect: max_batch_size is 0 and the declared shapes are whole)"]
    return []


def _count(message: mc.ModelConfig, key: str, where: str) -> int:
    value = message.parameters[key].string_value.strip()
    if not value.isdigit() or len(value) > 9:
        raise ConfigError(f"{where}: field parameters.{key}: {value!r} is not a non-negative integer")
    return int(value)
