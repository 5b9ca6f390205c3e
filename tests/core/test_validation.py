"""Matching decoded inputs to the model's declared inputs."""

from __future__ import annotations

import numpy as np
import pytest

from ortserve.core.types import InferInput, TensorSpec
from ortserve.core.validation import validate_inputs
from ortserve.errors import InvalidInput

SPECS = (TensorSpec("a", "FP32", (-1, 4)), TensorSpec("b", "INT64", (-1, 2)))


def tensor(name: str, datatype: str, array: np.ndarray) -> InferInput:
    return InferInput(name, datatype, array.shape, array)


def good() -> list[InferInput]:
    return [
        tensor("b", "INT64", np.zeros((3, 2), np.int64)),
        tensor("a", "FP32", np.zeros((3, 4), np.float32)),
    ]


def test_feeds_follow_the_model_order_and_rows_are_dim_zero() -> None:
    feeds, rows = validate_inputs(good(), SPECS, batched=True)
    assert list(feeds) == ["a", "b"] and rows == 3


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([tensor("a", "FP32", np.zeros((3, 4), np.float32))], "missing inputs \\['b'\\]"),
        ([*good(), tensor("c", "FP32", np.zeros((3, 4), np.float32))], "unexpected input 'c'"),
        ([*good(), tensor("a", "FP32", np.zeros((3, 4), np.float32))], "more than once"),
        ([tensor("a", "FP64", np.zeros((3, 4))), good()[0]], "datatype FP64"),
        ([tensor("a", "FP32", np.zeros((3, 5), np.float32)), good()[0]], "dimension 1"),
        ([tensor("a", "FP32", np.zeros((3, 4, 1), np.float32)), good()[0]], "rank 3"),
        ([tensor("a", "FP32", np.zeros((2, 4), np.float32)), good()[0]], "disagree on the batch"),
        (
            [
                tensor("a", "FP32", np.zeros((0, 4), np.float32)),
                tensor("b", "INT64", np.zeros((0, 2), np.int64)),
            ],
            "at least 1",
        ),
    ],
)
def test_mismatches_are_named(inputs: list[InferInput], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        validate_inputs(inputs, SPECS, batched=True)


def test_unbatched_models_count_one_row() -> None:
    _, rows = validate_inputs(good(), SPECS, batched=False)
    assert rows == 1


def test_bytes_inputs_become_text_and_must_be_utf8() -> None:
    specs = (TensorSpec("s", "BYTES", (2,)),)
    feeds, _ = validate_inputs(
        [tensor("s", "BYTES", np.array([b"caf\xc3\xa9", "x"], dtype=object))], specs, False
    )
    assert list(feeds["s"]) == ["café", "x"]
    with pytest.raises(InvalidInput, match="not UTF-8"):
        validate_inputs([tensor("s", "BYTES", np.array([b"\xff", b""], dtype=object))], specs, False)


@pytest.mark.parametrize(
    ("datatype", "array"),
    [("FP16", np.zeros((1, 4), np.float16)), ("UINT16", np.zeros((1, 4), np.uint16))],
)
def test_a_bf16_input_takes_only_the_bf16_datatype(datatype: str, array: np.ndarray) -> None:
    specs = (TensorSpec("x", "BF16", (-1, 4)),)
    feeds, _ = validate_inputs([tensor("x", "BF16", np.zeros((1, 4), np.uint16))], specs, True)
    assert feeds["x"].dtype == np.uint16
    with pytest.raises(InvalidInput, match=f"datatype {datatype}, the model expects BF16"):
        validate_inputs([tensor("x", datatype, array)], specs, True)


def test_a_refusal_is_bounded_whatever_the_client_named_and_the_model_declared() -> None:
    # 500 declared inputs and a 100,000-character name: the message names 8 of the model's
    # inputs and the start of the client's name, not all of either.
    specs = tuple(TensorSpec(f"in{index:03d}", "FP32", (-1, 4)) for index in range(500))
    stranger = tensor("x" * 100_000, "FP32", np.zeros((1, 4), np.float32))
    with pytest.raises(InvalidInput) as caught:
        validate_inputs([stranger], specs, batched=True)
    message = caught.value.message
    assert len(message) < 400, len(message)
    assert "'in000'" in message and "'in007'" in message and "'in008'" not in message
    assert "and 492 more" in message and "(100000 characters)" in message


def test_missing_inputs_are_listed_boundedly() -> None:
    specs = tuple(TensorSpec(f"in{index:03d}", "FP32", (-1, 4)) for index in range(500))
    with pytest.raises(InvalidInput, match=r"missing inputs \['in001', .* and 491 more"):
        validate_inputs([tensor("in000", "FP32", np.zeros((1, 4), np.float32))], specs, batched=True)
