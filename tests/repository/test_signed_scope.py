"""Signatures name what they sign: model, version, the model's config file and a purpose."""

from __future__ import annotations

import base64
import logging
import os
import shutil
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from model_builders import write_scaled_version
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.repository.signature import (
    SIGNATURE_FILE,
    SignatureError,
    generate_key,
    load_trusted_keys,
    sign_version,
    verify_version,
)
from ortserve.settings import ServerSettings


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "keys" / "release"
    path.parent.mkdir()
    generate_key(path)
    return path


def _copy_files(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        shutil.copy2(item, target / item.name)


def test_one_models_signed_files_copied_into_another_model_are_refused(tmp_path: Path, key: Path) -> None:
    sign_version(write_scaled_version(tmp_path, "cheap", 1, 1.0), key)
    _copy_files(tmp_path / "cheap" / "1", tmp_path / "premium" / "1")
    keys = load_trusted_keys(key.parent, True)
    assert verify_version(tmp_path / "cheap" / "1", keys)
    with pytest.raises(SignatureError, match="signed as model 'cheap' version 1, found as model 'premium'"):
        verify_version(tmp_path / "premium" / "1", keys)


def test_an_older_signed_version_copied_into_place_is_refused(tmp_path: Path, key: Path) -> None:
    sign_version(write_scaled_version(tmp_path, "m", 1, 1.0), key)
    sign_version(write_scaled_version(tmp_path, "m", 2, 2.0), key)
    shutil.rmtree(tmp_path / "m" / "2")
    _copy_files(tmp_path / "m" / "1", tmp_path / "m" / "2")
    with pytest.raises(SignatureError, match="signed as model 'm' version 1, found as model 'm' version 2"):
        verify_version(tmp_path / "m" / "2", load_trusted_keys(key.parent, True))


def test_min_signed_version_refuses_a_rollback(tmp_path: Path, key: Path) -> None:
    sign_version(write_scaled_version(tmp_path, "m", 1, 1.0), key)
    sign_version(write_scaled_version(tmp_path, "m", 2, 2.0), key)
    keys = load_trusted_keys(key.parent, True, min_version=2)
    assert verify_version(tmp_path / "m" / "2", keys)
    with pytest.raises(SignatureError, match="below --min-signed-version 2"):
        verify_version(tmp_path / "m" / "1", keys)


def test_the_model_config_file_is_signed_with_the_version(tmp_path: Path, key: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text("batching: {max_batch_size: 8}\n")
    sign_version(write_scaled_version(tmp_path, "m", 1, 1.0), key)
    keys = load_trusted_keys(key.parent, True)
    assert verify_version(tmp_path / "m" / "1", keys)
    (tmp_path / "m" / "config.yaml").write_text("batching: {max_batch_size: 4}\n")
    with pytest.raises(SignatureError, match="configuration is not the one signed"):
        verify_version(tmp_path / "m" / "1", keys)
    (tmp_path / "m" / "config.yaml").unlink()
    with pytest.raises(SignatureError, match="configuration is not the one signed"):
        verify_version(tmp_path / "m" / "1", keys)


async def test_the_manager_refuses_a_version_copied_from_another_model(tmp_path: Path, key: Path) -> None:
    root = tmp_path / "models"
    sign_version(write_scaled_version(root, "cheap", 1, 1.0), key)
    _copy_files(root / "cheap" / "1", root / "premium" / "1")
    manager = LifecycleManager(
        ModelRegistry(), ServerSettings(root, intra_op_threads=1), None, load_trusted_keys(key.parent, True)
    )
    await manager.start()
    try:
        assert manager.registry.served_versions("cheap") == ("1",)
        assert manager.registry.served_versions("premium") == ()
        error = manager.registry.entry("premium").error
        assert error is not None and "signed as model 'cheap'" in error
    finally:
        await manager.close(5.0)


def _old_style_signature(folder: Path, key: Path) -> None:
    """A manifest as signed before scopes: file digests only."""
    sign_version(folder, key)
    document = orjson.loads((folder / SIGNATURE_FILE).read_bytes())
    manifest = document["manifest"]
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    assert isinstance(private, Ed25519PrivateKey)
    signed = "".join(f"{manifest[name]}  {name}\n" for name in sorted(manifest)).encode()
    old = {"manifest": manifest, "signature": base64.b64encode(private.sign(signed)).decode()}
    (folder / SIGNATURE_FILE).write_bytes(orjson.dumps(old))


def test_an_old_manifest_still_verifies_with_a_deprecation_warning(
    tmp_path: Path, key: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = write_scaled_version(tmp_path, "m", 1, 1.0)
    _old_style_signature(folder, key)
    caplog.set_level(logging.WARNING)
    assert verify_version(folder, load_trusted_keys(key.parent, True))
    assert "old manifest that names no model, version or config" in caplog.text
    with pytest.raises(SignatureError, match="old signature that names no version"):
        verify_version(folder, load_trusted_keys(key.parent, True, min_version=1))


def test_sign_refuses_a_symlinked_folder_instead_of_skipping_it(tmp_path: Path, key: Path) -> None:
    """os.walk skipped files under a symlinked folder: they were neither signed nor checked."""
    folder = write_scaled_version(tmp_path, "m", 1, 1.0)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "weights.bin").write_bytes(b"data")
    os.symlink(tmp_path / "elsewhere", folder / "data")
    with pytest.raises(SignatureError, match="data is a symlinked folder"):
        sign_version(folder, key)
    with pytest.raises(SignatureError, match="not a numbered version folder"):
        sign_version(tmp_path / "elsewhere", key)
