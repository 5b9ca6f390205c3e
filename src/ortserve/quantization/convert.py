"""The conversions: FP16 (onnxconverter-common, inputs and outputs kept FP32 so clients and
routing see the same signature), dynamic INT8 and static INT8 (ONNX Runtime's quantization
tools; static calibrated on real feeds, QDQ format)."""

from __future__ import annotations

import enum
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx

from ortserve.errors import InvalidInput
from ortserve.quantization.calibration import Feeds

__all__ = ["Method", "convert"]


class Method(enum.Enum):
    FP16 = "fp16"
    DYNAMIC_INT8 = "dynamic-int8"
    STATIC_INT8 = "static-int8"


def convert(source: Path, target: Path, method: Method, calibration: Sequence[Feeds]) -> None:
    """Write ``source`` converted by ``method`` to ``target``.

    Raises:
        InvalidInput: static INT8 without calibration feeds.
    """
    if method is Method.FP16:
        _fp16(source, target)
    elif method is Method.DYNAMIC_INT8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(source, target, weight_type=QuantType.QInt8)
    else:
        if not calibration:
            raise InvalidInput("static INT8 needs calibration inputs (--calibration DIR|FILE.npz)")
        _static(source, target, calibration)


def _fp16(source: Path, target: Path) -> None:
    from onnxconverter_common.float16 import convert_float_to_float16

    model = onnx.load(str(source))
    converted = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False)
    onnx.save(converted, str(target))


def _static(source: Path, target: Path, calibration: Sequence[Feeds]) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._feeds: Iterator[Feeds] = iter(calibration)

        def get_next(self) -> Feeds | None:
            return next(self._feeds, None)

    with tempfile.TemporaryDirectory() as scratch:
        prepared = Path(scratch) / "prepared.onnx"
        try:
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        except Exception:  # pre-processing is an optimisation; quantize the model as it is
            prepared = source
        quantize_static(
            prepared,
            target,
            Reader(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )


def check_method(name: str) -> Method:
    try:
        return Method(name)
    except ValueError:
        raise InvalidInput(f"unknown method {name!r}; one of {[m.value for m in Method]}") from None
