"""Triton's classification extension: an output asked for with ``classification: N`` answers
the top N of its elements as BYTES strings ``"score:index"`` or ``"score:index:label"``.

As Triton: per batch row when the model batches (shape ``[rows, k]``), over the whole output
otherwise (shape ``[k]``); ``k`` is N or the element count, whichever is smaller; a score is
written as C++ ``std::to_string`` writes it (6 decimals for floats); the label is the line of
the output's label file at that index (none past its end). Labels come from config.pbtxt's
``label_filename`` or a ``labels.txt`` beside the model (repository/labels.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ortserve.core.types import Parameters, TensorSpec
from ortserve.errors import InvalidInput

__all__ = ["CLASSIFICATION", "MAX_CLASS_COUNT", "class_count", "classify"]

CLASSIFICATION = "classification"
"""The requested output's parameter (tritonclient's ``class_count``)."""
MAX_CLASS_COUNT = 1 << 16
"""Most classes one output may ask for: a string each, per row."""
_NUMERIC = {
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "FP16",
    "BF16",
    "FP32",
    "FP64",
}


def class_count(parameters: Parameters, spec: TensorSpec) -> int | None:
    """The number of classes asked for ``spec`` (None: a plain output).

    Raises:
        InvalidInput: not a positive integer (0 is Triton's "no classification"), more than
            ``MAX_CLASS_COUNT``, or an output that holds no scores (BYTES, BOOL).
    """
    count = parameters.get(CLASSIFICATION)
    if count is None or count == 0:
        return None
    if type(count) is not int or count < 0 or count > MAX_CLASS_COUNT:
        raise InvalidInput(
            f"output {spec.name!r}: parameter 'classification' must be an integer in 0..{MAX_CLASS_COUNT}"
        )
    if spec.datatype not in _NUMERIC:
        raise InvalidInput(f"output {spec.name!r}: {spec.datatype} holds no scores to classify")
    return count


def classify(
    array: npt.NDArray[np.generic], datatype: str, count: int, labels: Sequence[str], batched: bool
) -> npt.NDArray[np.object_]:
    """The top ``count`` elements of ``array`` as Triton's classification strings (bytes).

    Ties keep the lower index first (a stable sort), so an answer is the same on every run.
    """
    scores = _as_scores(array, datatype)
    rows = scores.reshape(scores.shape[0], -1) if batched and scores.ndim else scores.reshape(1, -1)
    k = min(count, rows.shape[1])
    result = np.empty((rows.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for column, index in enumerate(order.tolist()):
            text = f"{_score(row[index])}:{index}"
            if index < len(labels) and labels[index]:
                text += f":{labels[index]}"
            result[r, column] = text.encode()
    return result if batched else result.reshape(k)


def _as_scores(array: npt.NDArray[np.generic], datatype: str) -> npt.NDArray[np.generic]:
    if datatype == "BF16":  # carried as uint16 (core/datatypes.py): the high half of a float32
        widened = array.astype(np.uint32) << 16
        return widened.view(np.float32)
    if datatype == "FP16":
        return array.astype(np.float32)
    return array


def _score(value: np.generic) -> str:
    """As ``std::to_string``: ``%f`` for floats, the integer for integers."""
    if isinstance(value, np.floating):
        return f"{float(value):f}"
    return str(int(value))
