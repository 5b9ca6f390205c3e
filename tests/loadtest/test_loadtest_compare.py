"""Compare mode: decoding JSON and binary infer responses and measuring output differences."""

from __future__ import annotations

import numpy as np
import orjson

from ortserve.loadtest.compare import Comparison, decode_outputs
from ortserve.loadtest.transports import Reply


def _json_reply(scores: list[list[float]], status: int = 200) -> Reply:
    body = orjson.dumps(
        {"outputs": [{"name": "output", "datatype": "FP32", "shape": [len(scores), len(scores[0])],
                      "data": [x for row in scores for x in row]}]}
    )  # fmt: skip
    return Reply(status, body)


def _binary_reply(scores: np.ndarray) -> Reply:
    raw = scores.astype(np.float32).tobytes()
    header = orjson.dumps(
        {"outputs": [{"name": "output", "datatype": "FP32", "shape": list(scores.shape),
                      "parameters": {"binary_data_size": len(raw)}}]}
    )  # fmt: skip
    return Reply(200, header + raw, len(header))


def test_json_and_binary_bodies_decode_to_the_same_arrays() -> None:
    scores = np.array([[0.5, 1.5, -2.0]], dtype=np.float32)
    from_json = decode_outputs(_json_reply(scores.tolist()))["output"]
    from_binary = decode_outputs(_binary_reply(scores))["output"]
    np.testing.assert_array_equal(from_json, from_binary)
    assert from_binary.shape == (1, 3)


def test_identical_outputs_show_no_difference() -> None:
    comparison = Comparison()
    comparison.add(_json_reply([[1.0, 2.0]]), _binary_reply(np.array([[1.0, 2.0]])))
    diff = comparison.outputs["output"]
    assert (diff.max_abs_error, diff.max_rel_error, diff.top1_agreement) == (0.0, 0.0, 1.0)


def test_differences_report_max_errors_and_top1_disagreement() -> None:
    comparison = Comparison()
    comparison.add(_json_reply([[1.0, 2.0], [3.0, 1.0]]), _json_reply([[1.0, 2.5], [1.0, 3.0]]))
    diff = comparison.outputs["output"]
    assert diff.max_abs_error == 2.0
    assert diff.max_rel_error == 2.0  # |1 - 3| / 1
    assert diff.top1_agreement == 0.5


def test_status_mismatches_are_counted_not_compared() -> None:
    comparison = Comparison()
    comparison.add(_json_reply([[1.0, 2.0]]), Reply(503, b'{"error": "busy"}'))
    assert comparison.status_mismatches == 1 and not comparison.outputs


def test_bf16_outputs_compare_as_values_in_json_and_binary() -> None:
    values = [1.0, -3.0, 0.2001953125]
    bits = np.array([[0x3F80, 0xC040, 0x3E4D]], dtype=np.uint16)  # the same three in bfloat16
    entry = {"name": "y", "datatype": "BF16", "shape": [1, 3]}
    json_body = orjson.dumps({"outputs": [entry | {"data": values}]})
    header = orjson.dumps({"outputs": [entry | {"parameters": {"binary_data_size": 6}}]})
    from_json = decode_outputs(Reply(200, json_body))["y"]
    from_binary = decode_outputs(Reply(200, header + bits.tobytes(), len(header)))["y"]
    np.testing.assert_array_equal(from_binary, [values])
    np.testing.assert_array_equal(from_json, from_binary)
