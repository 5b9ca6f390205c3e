"""Repository layout, version policies and config.yaml validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.config.model import LatestPolicy, SpecificPolicy, load_model_config
from ortserve.core.cpus import usable_cpus
from ortserve.errors import ConfigError
from ortserve.repository.layout import scan_repository, select_versions


def make_versions(root: Path, name: str, versions: list[str]) -> None:
    for version in versions:
        folder = root / name / version
        folder.mkdir(parents=True)
        (folder / "model.onnx").write_bytes(b"x")


def test_scan_finds_numbered_versions_with_a_model_file(tmp_path: Path) -> None:
    make_versions(tmp_path, "m", ["1", "3", "0", "abc"])
    (tmp_path / "m" / "7").mkdir()  # no model file
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "bad name!").mkdir()
    models = scan_repository(tmp_path)
    assert [m.name for m in models] == ["m"]
    assert sorted(models[0].versions) == [1, 3]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("latest", [9]),
        ("all", [9, 5, 2]),
        (LatestPolicy(latest=2), [9, 5]),
        (SpecificPolicy(specific=[2, 4]), [2]),
    ],
)
def test_version_policies(policy: object, expected: list[int]) -> None:
    available = {2: Path("a"), 5: Path("b"), 9: Path("c")}
    assert select_versions(available, policy) == expected  # type: ignore[arg-type]


def test_missing_config_means_defaults(tmp_path: Path) -> None:
    config = load_model_config(tmp_path)
    assert config.version_policy == "latest" and config.batching.max_batch_size is None


def test_config_fields_are_read(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "version_policy: {latest: 2}\ninstances: 2\nbatching:\n  max_batch_size: 16\n  latency_budget_ms: 20\n"
        "providers:\n  - name: CUDAExecutionProvider\n    options: {device_id: 0}\n  - CPUExecutionProvider\n"
    )
    config = load_model_config(tmp_path)
    assert config.version_policy == LatestPolicy(latest=2)
    assert config.batching.latency_budget_ms == 20
    providers = config.provider_list()
    assert providers is not None and [p.name for p in providers] == [
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("batching:\n  max_batch_size: -1\n", "batching.max_batch_size"),
        ("instances: many\n", "instances"),
        ("unknown_field: 1\n", "unknown_field"),
        ("batching:\n  priority_levels: 2\n  default_priority: 3\n", "batching"),
        ("version_policy: newest\n", "version_policy"),
        ("- a list\n", "top level"),
        ("key: [unclosed\n", "YAML"),
    ],
)
def test_config_errors_name_the_file_and_the_field(tmp_path: Path, text: str, field: str) -> None:
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_model_config(tmp_path)
    assert str(tmp_path / "config.yaml") in caught.value.message
    assert field in caught.value.message


def test_usable_cpus_follows_the_cgroup_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert usable_cpus(tmp_path) == min(2, usable_cpus(tmp_path / "nothing"))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(tmp_path) == usable_cpus(tmp_path / "nothing")


def test_usable_cpus_reads_cgroup_v1(tmp_path: Path) -> None:
    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cpus(tmp_path) == 1


def test_prepack_weights_false_turns_onnx_runtime_prepacking_off() -> None:
    from ortserve.config.model import ModelConfig
    from ortserve.core.session import plan_session, session_options

    lean = session_options(plan_session(ModelConfig(prepack_weights=False), 1, 1))
    assert lean.get_session_config_entry("session.disable_prepacking") == "1"
    default = session_options(plan_session(ModelConfig(), 1, 1))
    with pytest.raises(RuntimeError, match="does not have configuration"):
        default.get_session_config_entry("session.disable_prepacking")
