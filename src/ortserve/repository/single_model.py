"""``--model-name``: serve a repository of one model, or one model folder, under a given name.

KServe's storage initializer puts an InferenceService's ``storageUri`` at ``/mnt/models``: often
one model folder (``1/model.onnx`` ...) or a repository holding one model, named after whatever
the folder was called; clients address the InferenceService's name. The server is given a
view: a fresh folder holding one link, ``NAME`` -> that model folder, so everything else
(versions, config files, polling, signatures) reads the model as it is. A config.pbtxt's own
``name`` is not held against the new name (triton_config.py).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from ortserve.errors import RepositoryError
from ortserve.repository.layout import is_model_name, model_folders, version_folders

__all__ = ["VIEW_PREFIX", "single_model_view"]

VIEW_PREFIX = "ortserve-model-name-"


def single_model_view(root: Path, name: str) -> Path:
    """A repository serving the one model of ``root`` (or ``root`` itself) as ``name``.

    Raises:
        RepositoryError: ``name`` is not a model name, ``root`` is not a folder, or it holds no
            model or more than one.
    """
    if not is_model_name(name):
        raise RepositoryError(f"--model-name {name!r} is not a model name (letters, digits, _ . -)")
    if version_folders(root):
        model = root  # a model folder: numbered versions right inside
    else:
        models = model_folders(root)
        if len(models) != 1:
            found = ", ".join(m.name for m in models) or "none"
            raise RepositoryError(
                f"--model-name needs a model folder or a repository of one model; {root} holds {found}"
            )
        model = models[0]
    view = Path(tempfile.mkdtemp(prefix=VIEW_PREFIX))
    atexit.register(shutil.rmtree, view, True)
    (view / name).symlink_to(model.resolve(), target_is_directory=True)
    return view
