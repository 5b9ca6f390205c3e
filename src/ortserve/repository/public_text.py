"""Failure reasons as any client may read them: no absolute path, bounded length.

Load failures name files (the operator needs to know which) and carry ONNX Runtime's own text,
which quotes the absolute path it read. The repository index and control errors go to whoever
can reach the API, so there a file is named relative to the repository (``m/1/model.onnx``),
any other absolute path by its last component, and the text is cut to a bounded length. The
log keeps the full reason for the operator.
"""

from __future__ import annotations

import re
from pathlib import Path

from ortserve.config.bounded import bounded_text

__all__ = ["MAX_PUBLIC_CHARS", "public_text"]

MAX_PUBLIC_CHARS = 1000
_ABSOLUTE = re.compile(r"(?<![\w.~-])(?:/[^\s/:'\"(),;\[\]]+)+/(?=[^\s/])")
"""The folders of an absolute path (what precedes its last component)."""


def public_text(text: str, root: Path) -> str:
    """``text`` with paths under ``root`` made relative to it and other absolute folders
    removed, cut to :data:`MAX_PUBLIC_CHARS`."""
    for prefix in {str(root), str(root.resolve())}:
        text = text.replace(prefix.rstrip("/") + "/", "")
    return bounded_text(_ABSOLUTE.sub("", text), MAX_PUBLIC_CHARS)
