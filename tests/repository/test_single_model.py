"""--model-name: one model (a model folder, or a repository of one) served under KServe's name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from model_builders import write_scaled_version
from ortserve.errors import RepositoryError
from ortserve.repository.single_model import single_model_view
from ortserve.testing import run_server


def test_a_repository_of_one_model_or_a_model_folder_becomes_a_view_of_that_name(tmp_path: Path) -> None:
    write_scaled_version(tmp_path / "repo", "exported", 1, 2.0)
    for root in (tmp_path / "repo", tmp_path / "repo" / "exported"):
        view = single_model_view(root, "small-mlp")
        assert [p.name for p in view.iterdir()] == ["small-mlp"]
        assert (view / "small-mlp" / "1" / "model.onnx").is_file()


@pytest.mark.parametrize("name", ["../x", "", "a b"])
def test_a_name_that_is_no_model_name_is_refused(tmp_path: Path, name: str) -> None:
    write_scaled_version(tmp_path, "exported", 1, 2.0)
    with pytest.raises(RepositoryError, match="not a model name"):
        single_model_view(tmp_path, name)


def test_a_repository_of_several_models_is_refused_naming_them(tmp_path: Path) -> None:
    write_scaled_version(tmp_path, "a", 1, 2.0)
    write_scaled_version(tmp_path, "b", 1, 3.0)
    with pytest.raises(RepositoryError, match="holds a, b"):
        single_model_view(tmp_path, "small-mlp")


@pytest.mark.e2e
def test_tritonclient_reaches_the_model_by_the_given_name_whatever_its_config_pbtxt_says(
    tmp_path: Path,
) -> None:
    """As KServe runs it: storageUri is the model folder, --model-name the InferenceService's."""
    write_scaled_version(tmp_path / "mnt", "exported", 1, 2.0)
    folder = tmp_path / "mnt" / "exported"
    (folder / "config.pbtxt").write_text('name: "exported"\nplatform: "onnxruntime_onnx"\n')
    args = ["--model-name", "small-mlp", "--metrics-port", "-1"]
    with run_server(folder, tmp_path / "server.log", args) as server:
        client = httpclient.InferenceServerClient(server.http_address)
        try:
            assert client.is_model_ready("small-mlp")
            tensor = httpclient.InferInput("x", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            assert client.infer("small-mlp", [tensor]).as_numpy("y").tolist() == [[2.0] * 4]
            assert [m["name"] for m in client.get_model_repository_index()] == ["small-mlp"]
        finally:
            client.close()


def test_several_models_under_one_name_stop_the_server_with_one_line(tmp_path: Path) -> None:
    write_scaled_version(tmp_path, "a", 1, 2.0)
    write_scaled_version(tmp_path, "b", 1, 3.0)
    result = subprocess.run(
        [sys.executable, "-m", "ortserve", "serve", "--model-repository", str(tmp_path), "--model-name", "m"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "--model-name needs a model folder or a repository of one model" in result.stderr
    assert "Traceback" not in result.stderr
