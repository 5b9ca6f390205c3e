"""Output differences between two servers' answers to the same request (shadow/quantization gates)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import orjson

from ortserve.core.datatypes import BF16, BYTES, bf16_to_float32, numpy_dtype
from ortserve.loadtest.transports import Reply

__all__ = ["Comparison", "OutputDiff", "decode_outputs"]

Array = npt.NDArray[np.generic]
_TINY = 1e-12


def decode_outputs(reply: Reply) -> dict[str, Array]:
    """The outputs of an OIP infer response body, JSON or binary, by name.

    Raises:
        ValueError: the body is not an infer response.
    """
    body = memoryview(reply.body)
    header_length = reply.header_length if reply.header_length is not None else len(body)
    try:
        document = orjson.loads(body[:header_length])
        entries = document["outputs"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise ValueError("not an infer response") from None
    binary, offset, outputs = body[header_length:], 0, {}
    for entry in entries:
        shape, datatype = tuple(entry["shape"]), entry["datatype"]
        size = (entry.get("parameters") or {}).get("binary_data_size")
        if size is None:
            data = np.array(entry["data"], dtype=_json_dtype(datatype))
        elif datatype == BYTES:
            data = np.array([bytes(binary[offset : offset + size])], dtype=object)
        else:
            data = np.frombuffer(binary[offset : offset + size], dtype=numpy_dtype(datatype))
            if datatype == BF16:  # compare the values, not their bit patterns
                data = bf16_to_float32(data)
        offset += size or 0
        outputs[entry["name"]] = data.reshape(shape) if datatype != BYTES or size is None else data
    return outputs


def _json_dtype(datatype: str) -> np.dtype[np.generic]:
    if datatype == BYTES:
        return np.dtype(object)
    if datatype == BF16:  # JSON carries BF16 as numbers
        return np.dtype(np.float32)
    return numpy_dtype(datatype)


@dataclass(slots=True)
class OutputDiff:
    """How one output differed across all compared requests."""

    compared: int = 0
    shape_mismatches: int = 0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    top1_agree: int = 0
    top1_total: int = 0

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_agree / self.top1_total if self.top1_total else None

    def add(self, a: Array, b: Array) -> None:
        self.compared += 1
        if a.shape != b.shape:
            self.shape_mismatches += 1
            return
        if a.dtype.kind in "OSUb" or b.dtype.kind in "OSUb":
            self.max_abs_error = max(self.max_abs_error, float(np.count_nonzero(a != b)))
            return
        x, y = a.astype(np.float64), b.astype(np.float64)
        diff = np.abs(x - y)
        if diff.size:
            self.max_abs_error = max(self.max_abs_error, float(diff.max()))
            self.max_rel_error = max(self.max_rel_error, float((diff / np.maximum(np.abs(x), _TINY)).max()))
        if x.ndim >= 1 and x.shape[-1] > 1:  # classification-like: scores along the last axis
            agree = np.argmax(x, axis=-1) == np.argmax(y, axis=-1)
            self.top1_agree += int(agree.sum())
            self.top1_total += int(agree.size)


@dataclass(slots=True)
class Comparison:
    """Differences between a primary and a second target over a replay."""

    requests: int = 0
    status_mismatches: int = 0
    undecodable: int = 0
    outputs: dict[str, OutputDiff] = field(default_factory=dict)

    def add(self, a: Reply, b: Reply) -> None:
        """Compare one pair of replies (statuses, then each output present in both)."""
        self.requests += 1
        if a.status != b.status:
            self.status_mismatches += 1
            return
        if not 200 <= a.status < 300:
            return
        try:
            left, right = decode_outputs(a), decode_outputs(b)
        except ValueError:
            self.undecodable += 1
            return
        for name in left.keys() | right.keys():
            diff = self.outputs.setdefault(name, OutputDiff())
            if name not in left or name not in right:
                diff.compared += 1
                diff.shape_mismatches += 1
                continue
            diff.add(left[name], right[name])

    def to_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "status_mismatches": self.status_mismatches,
            "undecodable": self.undecodable,
            "outputs": {
                name: {
                    "compared": d.compared,
                    "shape_mismatches": d.shape_mismatches,
                    "max_abs_error": d.max_abs_error,
                    "max_rel_error": d.max_rel_error,
                    "top1_agreement": d.top1_agreement,
                }
                for name, d in sorted(self.outputs.items())
            },
        }

    def render(self) -> str:
        lines = [
            f"compare: {self.requests} requests, {self.status_mismatches} status mismatches, "
            f"{self.undecodable} undecodable"
        ]
        for name, d in sorted(self.outputs.items()):
            top1 = "n/a" if d.top1_agreement is None else f"{d.top1_agreement:.2%}"
            lines.append(
                f"  output {name}: max abs error {d.max_abs_error:.6g}, max rel error {d.max_rel_error:.6g}, "
                f"top-1 agreement {top1}, shape mismatches {d.shape_mismatches}/{d.compared}"
            )
        return "\n".join(lines)
