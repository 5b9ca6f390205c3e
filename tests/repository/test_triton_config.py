"""Triton config.pbtxt: parsed against model_config.proto and mapped, with one warning for the rest."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from model_builders import write_scaled_version
from ortserve.config.model import LatestPolicy, ProviderConfig, SpecificPolicy
from ortserve.core.model import VersionInfo
from ortserve.core.types import InferInput, InferRequest, TensorSpec
from ortserve.errors import ConfigError, InvalidInput
from ortserve.repository.config_source import read_model_source
from ortserve.repository.effective_config import effective_config
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.repository.triton_config import parse_json_config
from ortserve.repository.watcher import RepositoryWatcher
from ortserve.settings import ServerSettings

TRITON_CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 500
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 20000 max_queue_size: 64 }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { specific: { versions: [ 1, 3 ] } }
default_model_filename: "graph.onnx"
optimization { execution_accelerators {
  gpu_execution_accelerator : [ { name : "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ]
} }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def write(folder: Path, text: str, name: str = "config.pbtxt") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder


def test_a_triton_config_maps_to_batching_instances_versions_and_providers(tmp_path: Path) -> None:
    source = read_model_source(write(tmp_path / "m", TRITON_CONFIG))
    config = source.config
    assert config.batching.max_batch_size == 8
    assert config.batching.preferred_batch_sizes == [4, 8]
    assert config.batching.max_queue_delay_ms == 0.5
    assert (config.batching.priority_levels, config.batching.default_priority) == (3, 2)
    assert (config.batching.default_timeout_ms, config.batching.max_queue_size) == (20.0, 64)
    assert config.instances == 2
    assert config.version_policy == SpecificPolicy(specific=[1, 3])
    assert config.default_model_filename == "graph.onnx"
    assert config.intra_op_threads == 1
    assert config.provider_list() == [
        ProviderConfig(name="TensorrtExecutionProvider", options={"trt_fp16_enable": "True"}),
        ProviderConfig(name="CPUExecutionProvider"),
    ]
    assert [(t.name, t.datatype, t.dims) for t in source.inputs] == [("x", "FP32", (4,))]


def test_unsupported_fields_are_named_in_one_warning_per_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = (
        TRITON_CONFIG
        + 'model_operations { op_library_filename: [ "ops.so" ] }\nresponse_cache { enable: true }\n'
    )
    text += 'parameters { key: "enable_mem_arena" value: { string_value: "0" } }\n'
    with caplog.at_level(logging.WARNING):
        read_model_source(write(tmp_path / "m", text))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "config.pbtxt" in warnings[0]
    for field in (
        "model_operations.op_library_filename",
        "response_cache.enable",
        "parameters.enable_mem_arena",
    ):
        assert field in warnings[0]


async def test_a_polled_repository_warns_once_per_file_not_at_every_look(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_scaled_version(tmp_path, "m", 1, 2.0)
    write(tmp_path / "m", "max_batch_size: 8\nresponse_cache { enable: true }\n")
    manager = LifecycleManager(ModelRegistry(), ServerSettings(tmp_path, intra_op_threads=1))
    watcher = RepositoryWatcher(manager, "poll", 1.0)
    with caplog.at_level(logging.WARNING):
        watcher.seed(await manager.start())  # as the server does: what loaded at start is complete
        for _ in range(3):
            await watcher.scan()
        (tmp_path / "m" / "config.pbtxt").write_text("max_batch_size: 4\nresponse_cache { enable: true }\n")
        for _ in range(3):  # the changed file is read again, and warned about once more
            await watcher.scan()
    try:
        warnings = [r.getMessage() for r in caplog.records if "response_cache.enable" in r.getMessage()]
        assert len(warnings) == 2
        assert manager.registry.resolve("m", None).info.max_batch_size == 4
    finally:
        await manager.close(5.0)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('backend: "python"', "backend 'python'"),
        ('platform: "pytorch_libtorch"', "platform 'pytorch_libtorch'"),
        ('platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" } ] }', "ensemble"),
        ('name: "other"', "is not the model folder's name"),
        ("max_batch_size: oops", "cannot parse"),
        ("no_such_field: 1", "cannot parse"),
    ],
)
def test_other_backends_and_broken_files_are_refused_with_a_reason(
    tmp_path: Path, text: str, reason: str
) -> None:
    with pytest.raises(ConfigError, match=reason):
        read_model_source(write(tmp_path / "m", text))


def test_model_warmup_maps_to_warmup_samples(tmp_path: Path) -> None:
    text = (
        TRITON_CONFIG
        + """
model_warmup [
  { name: "zeros" batch_size: 8 count: 3 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } },
  { name: "noise" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } },
  { name: "real" batch_size: 2 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x.bin" } } }
]
"""
    )
    warmup = read_model_source(write(tmp_path / "m", text)).config.warmup
    assert [(w.name, w.batch_size, w.count) for w in warmup] == [
        ("zeros", 8, 3),
        ("noise", 1, 1),
        ("real", 2, 1),
    ]
    assert [(w.inputs["x"].data, w.inputs["x"].file) for w in warmup] == [
        ("zero", None),
        ("random", None),
        ("file", "x.bin"),
    ]
    assert warmup[0].inputs["x"].datatype == "FP32"
    assert warmup[0].inputs["x"].dims == [4]
    info = VersionInfo("m", "1", (TensorSpec("x", "FP32", (-1, 4)),), (), 8, ("CPUExecutionProvider",))
    answered = effective_config(info, read_model_source(tmp_path / "m").config).model_warmup
    assert [(w.name, w.batch_size, w.count) for w in answered] == [
        ("zeros", 8, 3),
        ("noise", 1, 1),
        ("real", 2, 1),
    ]
    assert answered[2].inputs["x"].input_data_file == "x.bin"
    assert answered[1].inputs["x"].random_data
    assert list(answered[0].inputs["x"].dims) == [4]


def test_a_reshape_is_declared_unless_it_changes_nothing(tmp_path: Path) -> None:
    same = TRITON_CONFIG.replace(
        "dims: [ 4 ] } ]\noutput", "dims: [ 4 ] reshape: { shape: [ 4 ] } } ]\noutput"
    )
    assert (
        read_model_source(write(tmp_path / "same", same.replace('name: "m"', 'name: "same"'))).reshapes()
        == ()
    )
    other = TRITON_CONFIG.replace(
        "dims: [ 4 ] } ]\noutput", "dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]\noutput"
    )
    assert read_model_source(write(tmp_path / "m", other)).inputs[0].reshape == (2, 2)


def test_both_config_files_are_refused(tmp_path: Path) -> None:
    folder = write(tmp_path / "m", "max_batch_size: 4")
    (folder / "config.yaml").write_text("instances: 1\n")
    with pytest.raises(ConfigError, match="both config.yaml and config.pbtxt"):
        read_model_source(folder)


def test_latest_and_all_policies_and_a_gpu_instance_group(tmp_path: Path) -> None:
    text = "version_policy: { latest: { num_versions: 2 } } instance_group [ { kind: KIND_GPU } ]"
    config = read_model_source(write(tmp_path / "a", text)).config
    assert config.version_policy == LatestPolicy(latest=2)
    assert [p.name for p in config.provider_list() or []] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert (
        read_model_source(write(tmp_path / "b", "version_policy: { all: {} }")).config.version_policy == "all"
    )


def test_a_json_config_from_a_load_request_maps_the_same_way() -> None:
    triton = parse_json_config('{"max_batch_size": 2, "instance_group": [{"count": 3}]}', "m")
    assert (triton.config.batching.max_batch_size, triton.config.instances) == (2, 3)
    with pytest.raises(ConfigError, match="parameters.config"):
        parse_json_config('{"max_batch_size": "many"', "m")


async def test_a_triton_repository_serves_with_its_batch_limit_and_effective_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_scaled_version(tmp_path, "m", 1, 2.0)
    (tmp_path / "m" / "1" / "model.onnx").rename(tmp_path / "m" / "1" / "graph.onnx")
    write(tmp_path / "m", TRITON_CONFIG.replace("[ 1, 3 ]", "[ 1 ]"))
    manager = LifecycleManager(ModelRegistry(), ServerSettings(tmp_path, intra_op_threads=1))
    with caplog.at_level(logging.WARNING):
        await manager.start()
    try:
        served = manager.registry.resolve("m", None)
        assert any("TensorrtExecutionProvider is not available" in r.getMessage() for r in caplog.records)
        nine = np.ones((9, 4), np.float32)
        with pytest.raises(InvalidInput, match="max_batch_size 8"):
            served.submit(InferRequest("m", [InferInput("x", "FP32", nine.shape, nine)]))
        config = effective_config(served.info, manager.registry.entry("m").config)
        assert (config.max_batch_size, config.instance_group[0].count) == (8, 2)
        assert list(config.input[0].dims) == [4]
        assert config.dynamic_batching.max_queue_delay_microseconds == 500
    finally:
        await manager.close(5.0)


async def test_declared_tensors_must_match_the_graph(tmp_path: Path) -> None:
    write_scaled_version(tmp_path, "m", 1, 2.0)
    write(tmp_path / "m", 'max_batch_size: 8 input [ { name: "x" data_type: TYPE_INT64 dims: [ 4 ] } ]')
    manager = LifecycleManager(ModelRegistry(), ServerSettings(tmp_path, intra_op_threads=1))
    await manager.start()
    try:
        entry = manager.registry.entry("m")
        assert not entry.versions
        assert "data_type INT64; the graph says FP32" in (entry.error or "")
    finally:
        await manager.close(5.0)


def test_yaml_parameters_take_no_anchors_or_aliases() -> None:
    """An alias is cheap to parse and copied by validation every time it is used: 20,000
    aliases to a 20,000-element list (a 270 KB load request) held the loop 8 s and 800 MB."""
    bomb = "i0: {max_shape: &d [1, 1]}\ni1: {max_shape: *d}\n"
    document = {"parameters": {"ortserve.inputs": {"string_value": bomb}}}
    with pytest.raises(ConfigError, match="anchors and aliases are not allowed"):
        parse_json_config(json.dumps(document), "m")
    document = {"parameters": {"ortserve.inputs": {"string_value": "i0: {max_shape: [1, 1]}"}}}
    assert parse_json_config(json.dumps(document), "m").config.inputs["i0"].max_shape == [1, 1]
