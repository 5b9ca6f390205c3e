"""Class labels for the classification extension (core/classification.py), read at load.

An output's labels are, as Triton's, the lines of its ``label_filename`` (a file in the model
folder) as the configuration in force declares it: config.pbtxt's, or the configuration a load
request gave; an output without one takes ``labels.txt`` beside the model (the version
folder's, else the model folder's), the file most exporters write. No file: answers carry
``score:index`` without a label.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ortserve.core.types import TensorSpec
from ortserve.errors import ConfigError

__all__ = ["LABELS_FILE", "MAX_LABEL_BYTES", "output_labels"]

LABELS_FILE = "labels.txt"
MAX_LABEL_BYTES = 16 * 1024 * 1024
"""Largest label file read (ImageNet's 21k classes are about 400 KB)."""


def output_labels(
    model_dir: Path, version_dir: Path, outputs: tuple[TensorSpec, ...], named: Mapping[str, str]
) -> Mapping[str, tuple[str, ...]]:
    """Each output's labels (outputs without any are left out); ``named``: each output's
    declared ``label_filename``.

    Raises:
        ConfigError: a ``label_filename`` that is not a file name in the model folder, missing,
            unreadable, not UTF-8, or larger than ``MAX_LABEL_BYTES``.
    """
    shared: tuple[str, ...] | None = None
    for folder in (version_dir, model_dir):
        if (folder / LABELS_FILE).is_file():
            shared = _read(folder / LABELS_FILE)
            break
    labels: dict[str, tuple[str, ...]] = {}
    for spec in outputs:
        filename = named.get(spec.name)
        if filename is not None:
            if Path(filename).name != filename or filename in ("", ".", ".."):
                raise ConfigError(
                    f"output {spec.name!r} label_filename {filename!r} must be a file name in the model folder"
                )
            labels[spec.name] = _read(model_dir / filename)
        elif shared is not None:
            labels[spec.name] = shared
    return labels


def _read(path: Path) -> tuple[str, ...]:
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_LABEL_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the label file: {exc.strerror}") from None
    if len(raw) > MAX_LABEL_BYTES:
        raise ConfigError(f"{path}: label file larger than {MAX_LABEL_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: the label file is not UTF-8 text") from None
    return tuple(line.rstrip("\r") for line in text.split("\n"))
