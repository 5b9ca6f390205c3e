"""Signed versions: every file's SHA-256 under an Ed25519 signature, checked at every load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from model_builders import scaled_model, write_scaled_version
from ortserve.config.model import ModelConfig
from ortserve.core.types import InferInput, InferRequest
from ortserve.repository.index import repository_index
from ortserve.repository.loader import LoadInputs, load_version
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.repository.signature import (
    SIGNATURE_FILE,
    SignatureError,
    generate_key,
    load_trusted_keys,
    sign_version,
    verify_and_read,
    verify_version,
)
from ortserve.settings import ServerSettings


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "keys" / "release"
    path.parent.mkdir()
    generate_key(path)
    return path


@pytest.fixture
def version(tmp_path: Path, key: Path) -> Path:
    folder = write_scaled_version(tmp_path / "models", "m", 1, 1.0)
    (folder / "weights.bin").write_bytes(b"external data")
    sign_version(folder, key)
    return folder


def test_a_signed_version_verifies_and_the_private_key_is_private(version: Path, key: Path) -> None:
    assert verify_version(version, load_trusted_keys(key.parent, True))
    assert key.stat().st_mode & 0o777 == 0o600


def test_unsigned_is_refused_only_when_signatures_are_required(tmp_path: Path, key: Path) -> None:
    folder = write_scaled_version(tmp_path, "m", 1, 1.0)
    public = key.with_name(key.name + ".pub")
    assert not verify_version(folder, load_trusted_keys(public, False))
    with pytest.raises(SignatureError, match="unsigned"):
        verify_version(folder, load_trusted_keys(public, True))


def test_a_tampered_byte_names_the_file(version: Path, key: Path) -> None:
    data = bytearray((version / "weights.bin").read_bytes())
    data[0] ^= 1
    (version / "weights.bin").write_bytes(bytes(data))
    with pytest.raises(SignatureError, match=r"weights.bin: its SHA-256 does not match"):
        verify_version(version, load_trusted_keys(key.parent, True))


def test_a_signature_by_another_key_is_refused(version: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    generate_key(other)
    with pytest.raises(SignatureError, match="not made by a trusted key"):
        verify_version(version, load_trusted_keys(other.with_name("other.pub"), True))


def test_a_missing_or_an_extra_file_is_refused(version: Path, key: Path) -> None:
    keys = load_trusted_keys(key.parent, True)
    (version / "extra.txt").write_text("smuggled")
    with pytest.raises(SignatureError, match=r"extra.txt: not in the signed manifest"):
        verify_version(version, keys)
    (version / "extra.txt").unlink()
    (version / "weights.bin").unlink()
    with pytest.raises(SignatureError, match=r"weights.bin: listed in the signed manifest but missing"):
        verify_version(version, keys)


def test_a_forged_manifest_is_refused(version: Path, key: Path) -> None:
    text = (version / SIGNATURE_FILE).read_text()
    (version / SIGNATURE_FILE).write_text(text.replace('"weights.bin": "', '"weights.bin": "0'))
    with pytest.raises(SignatureError, match="not made by a trusted key|not a signature"):
        verify_version(version, load_trusted_keys(key.parent, True))


async def test_the_manager_refuses_a_tampered_version_and_keeps_the_signed_one(
    tmp_path: Path, key: Path
) -> None:
    root = tmp_path / "models"
    sign_version(write_scaled_version(root, "m", 1, 1.0), key)
    keys = load_trusted_keys(key.parent, True)
    manager = LifecycleManager(ModelRegistry(), ServerSettings(root, intra_op_threads=1), None, keys)
    await manager.start()
    try:
        folder = write_scaled_version(root, "m", 2, 2.0)
        sign_version(folder, key)
        with (folder / "model.onnx").open("ab") as model:
            model.write(b"\0")
        with pytest.raises(Exception, match="model.onnx: its SHA-256 does not match"):
            await manager.load("m")
        assert manager.registry.served_versions("m") == ("1",)
        rows = {r.version: r for r in repository_index(manager.registry, root, False)}
        assert rows["2"].state == "UNAVAILABLE" and "model.onnx" in rows["2"].reason
    finally:
        await manager.close(5.0)


async def test_the_session_is_built_from_the_bytes_that_were_hashed(version: Path, key: Path) -> None:
    verified = verify_and_read(version, load_trusted_keys(key.parent, True), "model.onnx")
    assert verified.signed and verified.model_bytes == (version / "model.onnx").read_bytes()
    onnx.save(scaled_model(5.0), str(version / "model.onnx"))  # replaced after the check
    given = LoadInputs(model_bytes=verified.model_bytes)
    settings = ServerSettings(version.parent.parent, intra_op_threads=1)
    served = await load_version("m", 1, version / "model.onnx", ModelConfig(), settings, None, given)
    try:
        x = np.ones((1, 4), np.float32)
        answer = await served.infer(InferRequest("m", [InferInput("x", "FP32", x.shape, x)]))
        assert float(answer.outputs[0].data[0, 0]) == 1.0  # the signed graph's scale, not 5
    finally:
        await served.unload(0.0)
    assert (
        verify_and_read(version.parent / "absent", load_trusted_keys(key.parent, False), None).model_bytes
        is None
    )


def test_keygen_and_sign_commands(tmp_path: Path) -> None:
    folder = write_scaled_version(tmp_path, "m", 1, 1.0)
    command = [sys.executable, "-m", "ortserve"]
    subprocess.run([*command, "keygen", str(tmp_path / "k")], check=True, capture_output=True)
    again = subprocess.run([*command, "keygen", str(tmp_path / "k")], capture_output=True, text=True)
    assert again.returncode == 2 and "not overwriting" in again.stderr
    subprocess.run(
        [*command, "sign", str(folder), "--key", str(tmp_path / "k")], check=True, capture_output=True
    )
    assert verify_version(folder, load_trusted_keys(tmp_path / "k.pub", True))


async def test_a_signed_version_may_not_fall_back_to_an_unverified_lighter_model(
    tmp_path: Path, key: Path
) -> None:
    """The lighter model's folder is not verified where the fallback is built: with trusted
    keys, a verified version must not fall back to bytes nobody verified."""
    root = tmp_path / "models"
    folder = write_scaled_version(root, "m", 1, 1.0)
    write_scaled_version(root, "light", 1, 0.5)  # unsigned
    (root / "m" / "config.yaml").write_text("fallback: {model: light}\n")
    sign_version(folder, key)  # the model's config.yaml is signed with the version
    keys = load_trusted_keys(key.parent, False)
    settings = ServerSettings(root, intra_op_threads=1, trusted_keys=key.parent)
    manager = LifecycleManager(ModelRegistry(), settings, None, keys)
    await manager.start(["m"])
    try:
        error = manager.registry.entry("m").error
        assert error is not None and "fallback.model is not available with --trusted-keys" in error
    finally:
        await manager.close(5.0)
