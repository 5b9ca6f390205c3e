"""Generated load inputs: BF16 inputs are bfloat16 bit patterns, numbers in JSON, raw bits in binary."""

from __future__ import annotations

import numpy as np
import orjson

from ortserve.core.datatypes import bf16_to_float32
from ortserve.loadtest.inputs import InputSpec, encode_payload, generated_inputs


def test_generated_bf16_inputs_are_bit_patterns_of_normal_values() -> None:
    (inputs,) = generated_inputs([InputSpec("x", "BF16", (-1, 64))], batch_size=4, count=1)
    datatype, bits = inputs["x"]
    assert datatype == "BF16" and bits.dtype == np.uint16 and bits.shape == (4, 64)
    values = bf16_to_float32(bits)
    assert np.isfinite(values).all() and 0.5 < float(values.std()) < 2.0


def test_bf16_payloads_carry_numbers_in_json_and_bits_in_binary() -> None:
    bits = np.array([[0x3F80, 0xC040]], dtype=np.uint16)
    document = orjson.loads(encode_payload({"x": ("BF16", bits)}, "/infer", "json").body)
    assert document["inputs"][0]["data"] == [1.0, -3.0]
    binary = encode_payload({"x": ("BF16", bits)}, "/infer", "binary").body
    assert binary.endswith(b"\x80\x3f\x40\xc0")
    assert b'"binary_data_size":4' in binary
