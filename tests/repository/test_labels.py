"""Class labels: the configuration's label_filename per output, else labels.txt beside the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.core.types import TensorSpec
from ortserve.errors import ConfigError
from ortserve.repository.labels import MAX_LABEL_BYTES, output_labels

OUTPUTS = (TensorSpec("probs", "FP32", (-1, 3)), TensorSpec("logits", "FP32", (-1, 3)))


def model_folder(tmp_path: Path) -> tuple[Path, Path]:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    return tmp_path / "m", version


def test_label_filename_names_an_outputs_labels_and_labels_txt_serves_the_others(tmp_path: Path) -> None:
    model, version = model_folder(tmp_path)
    (model / "classes.txt").write_text("cat\ndog\n")
    (model / "labels.txt").write_text("a\nb\n")
    labels = output_labels(model, version, OUTPUTS, {"probs": "classes.txt"})
    assert labels["probs"][:2] == ("cat", "dog")
    assert labels["logits"][:2] == ("a", "b")


def test_the_version_folders_labels_txt_comes_first_and_no_file_means_no_labels(tmp_path: Path) -> None:
    model, version = model_folder(tmp_path)
    assert output_labels(model, version, OUTPUTS, {}) == {}
    (model / "labels.txt").write_text("model\n")
    (version / "labels.txt").write_text("version\r\n")
    assert output_labels(model, version, OUTPUTS, {})["probs"][0] == "version"


@pytest.mark.parametrize("name", ["../secret.txt", "/etc/passwd", "sub/labels.txt", "missing.txt"])
def test_a_label_filename_outside_the_folder_or_missing_fails_the_load(tmp_path: Path, name: str) -> None:
    model, version = model_folder(tmp_path)
    with pytest.raises(ConfigError, match="label"):
        output_labels(model, version, OUTPUTS, {"probs": name})


def test_a_label_file_past_the_size_limit_is_refused(tmp_path: Path) -> None:
    model, version = model_folder(tmp_path)
    (model / "labels.txt").write_bytes(b"x" * (MAX_LABEL_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than"):
        output_labels(model, version, OUTPUTS, {})


def test_config_pbtxt_and_a_load_requests_json_config_declare_label_filename() -> None:
    pbtxt = (
        'name: "m" output [{ name: "probs" data_type: TYPE_FP32 dims: [3] label_filename: "classes.txt" }]'
    )
    json_config = (
        '{"output": [{"name": "probs", "data_type": "TYPE_FP32", "dims": [3], "label_filename": "c.txt"}]}'
    )
    from google.protobuf import text_format

    from ortserve.protocol.grpc import model_config_pb2 as mc
    from ortserve.repository.triton_config import parse_json_config, to_model_config

    parsed = to_model_config(text_format.Parse(pbtxt, mc.ModelConfig()), "config.pbtxt", "m")
    assert [(t.name, t.label_filename) for t in parsed.outputs] == [("probs", "classes.txt")]
    assert [(t.name, t.label_filename) for t in parse_json_config(json_config, "m").outputs] == [
        ("probs", "c.txt")
    ]
