"""config.pbtxt semantics as Triton's ONNX Runtime backend reads them: refusals of stateful and
decoupled models, graph level and execution mode, batching as auto-complete gives it, true warnings."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from model_builders import write_scaled_version
from ortserve.config.model import ModelConfig
from ortserve.errors import ConfigError
from ortserve.repository.config_source import read_model_source
from ortserve.testing import run_server

TENSORS = 'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]'


def source_config(tmp_path: Path, text: str) -> ModelConfig:
    folder = tmp_path / "m"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(text)
    return read_model_source(folder).config


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("max_batch_size: 8 sequence_batching { max_sequence_idle_microseconds: 5000000 }", "stateful model"),
        ("max_batch_size: 8 model_transaction_policy { decoupled: true }", "exactly one response"),
        ("optimization { graph { level: 3 } }", "optimization.graph.level: 3"),
        ('parameters { key: "execution_mode" value: { string_value: "2" } }', "execution_mode"),
        ('parameters { key: "intra_op_thread_count" value: { string_value: "-1" } }', "non-negative"),
    ],
)
def test_what_cannot_be_served_as_written_is_refused_with_a_reason(
    tmp_path: Path, text: str, reason: str
) -> None:
    with pytest.raises(ConfigError, match=reason):
        source_config(tmp_path, text)


@pytest.mark.parametrize(("level", "mapped"), [(-1, "basic"), (0, "all"), (1, "extended"), (2, "disabled")])
def test_the_graph_level_maps_as_the_onnxruntime_backend_maps_it(
    tmp_path: Path, level: int, mapped: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        config = source_config(tmp_path, f"optimization {{ graph {{ level: {level} }} }}")
    assert config.graph_optimization_level == mapped
    assert warnings_of(caplog) == []


def thread_config(tmp_path: Path, **parameters: str) -> ModelConfig:
    text = "".join(
        f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
        for key, value in parameters.items()
    )
    return source_config(tmp_path, text)


def test_parallel_execution_takes_the_inter_op_count_or_two_threads(tmp_path: Path) -> None:
    config = thread_config(tmp_path, execution_mode="1", inter_op_thread_count="4")
    assert config.inter_op_threads == 4
    assert thread_config(tmp_path, execution_mode="1").inter_op_threads == 2
    assert thread_config(tmp_path, execution_mode="1", inter_op_thread_count="0").inter_op_threads == 2


def test_a_zero_thread_count_is_onnxruntimes_default(tmp_path: Path) -> None:
    config = thread_config(tmp_path, intra_op_thread_count="0", inter_op_thread_count="0")
    assert (config.intra_op_threads, config.inter_op_threads) == (None, None)


def test_an_inter_op_count_in_sequential_execution_runs_one_thread_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        config = thread_config(tmp_path, inter_op_thread_count="4")  # Triton's default: sequential
    assert config.inter_op_threads == 1
    (warning,) = warnings_of(caplog)
    assert "inter_op_thread_count=4 (no effect in sequential execution" in warning


def test_without_max_batch_size_or_tensors_the_graph_decides_as_auto_complete(tmp_path: Path) -> None:
    assert source_config(tmp_path, 'platform: "onnxruntime_onnx"').batching.max_batch_size is None
    assert source_config(tmp_path, TENSORS).batching.max_batch_size == 0  # whole shapes declared


def test_an_empty_dynamic_batching_is_batching_and_not_reported_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        config = source_config(tmp_path, "max_batch_size: 8 dynamic_batching { }")
    assert (config.batching.max_batch_size, config.batching.max_queue_delay_ms) == (8, 0.0)
    assert warnings_of(caplog) == []
    with caplog.at_level(logging.WARNING):
        source_config(tmp_path, TENSORS + " dynamic_batching { }")
    (warning,) = warnings_of(caplog)
    assert "dynamic_batching (no effect: max_batch_size is 0" in warning


def test_a_served_pbtxt_without_max_batch_size_batches_as_tritons_would(tmp_path: Path) -> None:
    """End to end with tritonclient: the config the server reports batches, graph level mapped."""
    root = tmp_path / "models"
    write_scaled_version(root, "m", 1, 2.0)
    (root / "m" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\noptimization { graph { level: 1 } }\n'
        'parameters { key: "execution_mode" value: { string_value: "1" } }\n'
    )
    with run_server(root, tmp_path / "server.log", ["--intra-op-threads", "1"]) as server:
        client = httpclient.InferenceServerClient(server.http_address)
        try:
            config = client.get_model_config("m")
        finally:
            client.close()
    assert config["max_batch_size"] == 32
    assert "dynamic_batching" in config
    log = (tmp_path / "server.log").read_text()
    assert "inter-op threads 2" in log
    assert "not supported" not in log
