"""Triton's classification strings: top k per row, score formatting, labels, refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ortserve.core.classification import MAX_CLASS_COUNT, class_count, classify
from ortserve.core.types import TensorSpec
from ortserve.errors import InvalidInput

SCORES = TensorSpec("scores", "FP32", (-1, 4))


def test_a_batched_output_answers_the_top_classes_of_each_row_with_labels() -> None:
    scores = np.array([[0.1, 0.7, 0.2, 0.0], [0.5, 0.1, 0.1, 0.3]], dtype=np.float32)
    answer = classify(scores, "FP32", 2, ("cat", "dog", "bird"), batched=True)
    assert answer.shape == (2, 2)
    assert answer.tolist() == [
        [b"0.700000:1:dog", b"0.200000:2:bird"],
        [b"0.500000:0:cat", b"0.300000:3"],  # past the labels' end: no label, as Triton
    ]


def test_an_unbatched_output_is_classified_whole_and_k_is_capped_at_its_elements() -> None:
    answer = classify(np.array([[3, 9, 1]], dtype=np.int64), "INT64", 10, (), batched=False)
    assert answer.shape == (3,)
    assert answer.tolist() == [b"9:1", b"3:0", b"1:2"]


def test_ties_keep_the_lower_index_first() -> None:
    answer = classify(np.array([[1.0, 2.0, 2.0]], dtype=np.float32), "FP32", 3, (), batched=True)
    assert answer.tolist() == [[b"2.000000:1", b"2.000000:2", b"1.000000:0"]]


def test_bf16_scores_carried_as_uint16_are_read_as_floats() -> None:
    raw = np.array([[1.5, -2.0]], dtype=np.float32).view(np.uint32) >> 16
    answer = classify(raw.astype(np.uint16), "BF16", 1, ("a", "b"), batched=True)
    assert answer.tolist() == [[b"1.500000:0:a"]]


@pytest.mark.parametrize("count", [-1, 1.5, "3", True, MAX_CLASS_COUNT + 1])
def test_a_class_count_that_is_not_a_small_positive_integer_is_refused(count: Any) -> None:
    with pytest.raises(InvalidInput, match="classification"):
        class_count({"classification": count}, SCORES)


def test_zero_or_no_count_is_a_plain_output_and_strings_hold_no_scores() -> None:
    assert class_count({}, SCORES) is None
    assert class_count({"classification": 0}, SCORES) is None
    assert class_count({"classification": 3}, SCORES) == 3
    with pytest.raises(InvalidInput, match="no scores"):
        class_count({"classification": 3}, TensorSpec("text", "BYTES", (2,)))
