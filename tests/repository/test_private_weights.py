"""The bytes that serve are the bytes that were read (and checked): external-data weights are
never memory-mapped from the repository, so truncating, rewriting or swapping a served file
changes no answer and crashes nothing."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from external_weights import ROWS as _ROWS
from external_weights import external_model, write_external_version
from llm_reference import small_shape, write_random_llm
from ortserve.core.model_files import external_locations, read_model_files
from ortserve.core.types import InferInput, InferRequest
from ortserve.errors import ConfigError
from ortserve.llm.servable import LlmVersion
from ortserve.repository import version_build as version_build_module
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.repository.signature import (
    SignatureError,
    VerifiedVersion,
    generate_key,
    load_trusted_keys,
    sign_version,
    verify_and_read,
)
from ortserve.settings import ServerSettings
from ortserve.testing import run_server


def _infer(url: str, name: str) -> list[float]:
    body = {"inputs": [{"name": "x", "shape": [1, _ROWS], "datatype": "FP32", "data": [1.0] * _ROWS}]}
    request = urllib.request.Request(
        f"{url}/v2/models/{name}/infer", json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return [float(v) for v in json.loads(reply.read())["outputs"][0]["data"]]


@pytest.mark.parametrize("prepack", [True, False])
def test_a_served_weights_file_truncated_or_rewritten_in_place_changes_nothing(
    tmp_path: Path, prepack: bool
) -> None:
    """``cp new.bin w.bin`` truncates first: with the file mapped, the next request died of
    SIGBUS (exit -7); with prepack_weights false an in-place write changed the answers."""
    root = tmp_path / "models"
    folder = write_external_version(root, "m", 1, 2.0)
    (root / "m" / "config.yaml").write_text(f"prepack_weights: {str(prepack).lower()}\nintra_op_threads: 1\n")
    with run_server(root, tmp_path / "server.log") as server:
        assert _infer(server.http_url, "m") == [128.0] * 4
        with (folder / "w.bin").open("r+b") as handle:
            handle.truncate(0)
        assert _infer(server.http_url, "m") == [128.0] * 4
        (folder / "w.bin").write_bytes(np.full(_ROWS * 5, 7.0, np.float32).tobytes())
        assert _infer(server.http_url, "m") == [128.0] * 4
        assert server.process.poll() is None


def _swap_after_the_check(monkeypatch: pytest.MonkeyPatch, swap: Callable[[Path], None]) -> list[Path]:
    """Run ``swap`` on the version folder right after its signature was checked."""
    swapped: list[Path] = []

    def checked_then_swapped(folder: Path, *args: object) -> VerifiedVersion:
        verified = verify_and_read(folder, *args)  # type: ignore[arg-type]
        swap(folder)
        swapped.append(folder)
        return verified

    monkeypatch.setattr(version_build_module, "verify_and_read", checked_then_swapped)
    return swapped


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "keys" / "release"
    path.parent.mkdir()
    generate_key(path)
    return path


async def test_weights_swapped_by_rename_between_hash_and_load_are_never_served(
    tmp_path: Path, key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The external data was hashed and then memory-mapped again from the folder: weights
    renamed into place in between were served, logged as "signature verified"."""
    root = tmp_path / "models"
    sign_version(write_external_version(root, "m", 1, 2.0), key)

    def rename_other_weights(folder: Path) -> None:
        (folder / "w.new").write_bytes(np.full(_ROWS * 5, 7.0, np.float32).tobytes())
        os.rename(folder / "w.new", folder / "w.bin")

    swapped = _swap_after_the_check(monkeypatch, rename_other_weights)
    manager = LifecycleManager(
        ModelRegistry(), ServerSettings(root, intra_op_threads=1), None, load_trusted_keys(key.parent, True)
    )
    await manager.start()
    try:
        assert swapped
        served = manager.registry.resolve("m", None)
        runner = served.runner  # type: ignore[attr-defined]
        outputs, _ = runner.run_blocking({"x": np.ones((1, _ROWS), np.float32)})
        assert outputs[0].tolist() == [[128.0] * 4]  # the signed 2.0, not the swapped 7.0
    finally:
        await manager.close(5.0)


async def test_the_llm_loader_serves_the_verified_graph_tokenizer_and_config(
    tmp_path: Path, key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LLM loader read model.onnx, the tokenizer and config.json again from the folder:
    a graph and config swapped after the check were served."""
    root = tmp_path / "models"
    write_random_llm(root / "m" / "1", small_shape(layers=2))
    write_random_llm(tmp_path / "other", small_shape(layers=3), seed=5)
    (root / "m" / "config.yaml").write_text("kind: llm\nintra_op_threads: 1\nllm: {max_num_seqs: 2}\n")
    sign_version(root / "m" / "1", key)

    def rename_other_model(folder: Path) -> None:
        for name in ("model.onnx", "config.json", "tokenizer.json"):
            os.rename(tmp_path / "other" / name, folder / name)

    swapped = _swap_after_the_check(monkeypatch, rename_other_model)
    manager = LifecycleManager(
        ModelRegistry(), ServerSettings(root, intra_op_threads=1), None, load_trusted_keys(key.parent, True)
    )
    await manager.start()
    try:
        assert swapped
        served = manager.registry.resolve("m", None)
        assert isinstance(served, LlmVersion)
        assert served.engine.decoder.layout.layers == 2  # the signed graph, not the 3-layer one
    finally:
        await manager.close(5.0)


def test_a_signed_graph_naming_unlisted_external_data_is_refused(tmp_path: Path, key: Path) -> None:
    """A location the manifest does not list would be read from the folder, unchecked."""
    folder = write_external_version(tmp_path, "m", 1, 2.0)
    data = (folder / "w.bin").read_bytes()
    (folder / "w.bin").unlink()
    sign_version(folder, key)
    (folder / "w.bin").write_bytes(data)
    with pytest.raises(SignatureError, match="not in the signed manifest"):
        verify_and_read(folder, load_trusted_keys(key.parent, True), "model.onnx")


def test_external_data_outside_the_folder_is_refused(tmp_path: Path) -> None:
    model = external_model(1.0)
    onnx.save(
        model, str(tmp_path / "model.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0
    )
    graph = (tmp_path / "model.onnx").read_bytes().replace(b"w.bin", b"../xx")
    with pytest.raises(ConfigError, match="not inside the model's folder"):
        external_locations(graph, "m/1/model.onnx")
    files = read_model_files(tmp_path / "model.onnx")
    assert list(files.external) == ["w.bin"] and files.size > _ROWS * 4 * 4


async def test_a_fallback_session_of_a_signed_version_is_built_from_the_verified_bytes(
    tmp_path: Path, key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU fallback level (and a level per device) read the model and its weights again
    from the folder: weights swapped after the check answered whenever the primary failed."""
    root = tmp_path / "models"
    folder = write_external_version(root, "m", 1, 2.0)
    (root / "m" / "config.yaml").write_text(
        "intra_op_threads: 1\nfallback: {session: cpu, build: load}\nfaults: {L0: {error_rate: 1.0}}\n"
    )
    sign_version(folder, key)

    def rename_other_weights(folder: Path) -> None:
        (folder / "w.new").write_bytes(np.full(_ROWS * 5, 7.0, np.float32).tobytes())
        os.rename(folder / "w.new", folder / "w.bin")

    _swap_after_the_check(monkeypatch, rename_other_weights)
    settings = ServerSettings(root, intra_op_threads=1, enable_fault_injection=True)
    manager = LifecycleManager(ModelRegistry(), settings, None, load_trusted_keys(key.parent, True))
    await manager.start()
    try:
        x = np.ones((1, _ROWS), np.float32)
        answer = await manager.registry.resolve("m", None).infer(
            InferRequest("m", [InferInput("x", "FP32", x.shape, x)])
        )
        assert answer.outputs[0].data.tolist() == [[128.0] * 4]  # the L2 CPU session, signed bytes
    finally:
        await manager.close(5.0)
