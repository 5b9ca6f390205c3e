"""What a load request's config may not set: files for a provider to write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ortserve.errors import ConfigError
from ortserve.server.model_control import ModelControl
from ortserve.settings import ServerSettings


class RecordingManager:
    def __init__(self) -> None:
        self.loaded: list[tuple[str, Any]] = []
        self.settings = ServerSettings(Path("/srv/models"))

    async def load(self, name: str, override: Any) -> None:
        self.loaded.append((name, override))


def config_with(parameters: dict[str, str]) -> str:
    accelerator = {"name": "tensorrt", "parameters": parameters}
    return json.dumps(
        {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [accelerator]}}}
    )


@pytest.mark.parametrize(
    "key", ["trt_engine_cache_path", "trt_timing_cache_path", "trt_dump_subgraphs_dir", "some_FILE"]
)
async def test_a_provider_option_naming_a_file_is_refused_in_a_load_request(key: str) -> None:
    """Whoever reaches the control API would choose where the server writes (TensorRT's
    caches): only the repository's own config files may name them."""
    manager = RecordingManager()
    control = ModelControl(manager, "explicit")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"option '{key}' names a file"):
        await control.load("m", config_with({key: "/etc/cron.d/x"}))
    assert manager.loaded == []
    await control.load("m", config_with({"trt_fp16_enable": "true"}))
    assert [name for name, _ in manager.loaded] == ["m"]
