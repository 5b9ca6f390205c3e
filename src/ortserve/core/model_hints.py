"""What to do about the failures user models commonly hit at load, said where they are refused.

- scikit-learn classifiers converted by skl2onnx answer probabilities through a ``ZipMap``
  node: a sequence of maps (one ``{label: probability}`` per row), which no Open Inference
  Protocol datatype carries. The converter's ``zipmap=False`` option gives a tensor instead.
- The generated warm-up feeds every dynamic dimension 1 (the batch dimension the warm-up batch
  size). A graph with a size baked in (a TorchScript export traced at one sequence length, a
  ``Reshape`` to a fixed shape) fails there with ONNX Runtime's own error, which says nothing
  of warm-up; the message says where it came from and how to give a real sample.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

__all__ = ["generated_warmup_failure", "unsupported_type_hint"]


def unsupported_type_hint(ort_type: str) -> str:
    """A hint for a graph input or output of ``ort_type`` that no datatype carries ("" if none)."""
    if ort_type.startswith(("seq(map(", "map(")):
        return (
            "; this is the ZipMap output skl2onnx gives classifiers (one {label: probability} map "
            "per row): convert with options={id(model): {'zipmap': False}} (or "
            "to_onnx(..., options={'zipmap': False})) to answer a probability tensor"
        )
    if ort_type.startswith(("seq(", "optional(")):
        return "; sequences and optionals are not served: export the graph with tensor inputs and outputs"
    return ""


def generated_warmup_failure(
    label: str, feeds: Mapping[str, npt.NDArray[np.generic]], error: BaseException, samples: bool
) -> str:
    """The message of a generated warm-up run that failed (``samples``: the config has its own)."""
    shapes = ", ".join(f"{name} {list(array.shape)}" for name, array in feeds.items())
    advice = (
        "the model's own warm-up samples (warmup / model_warmup) ran instead"
        if samples
        else "give a real sample in config.yaml (warmup: [{name: real, batch_size: 1, inputs: {INPUT: "
        "{datatype: FP32, dims: [...], data: random}}}]) or config.pbtxt model_warmup, and "
        "warmup_batch_sizes the graph takes; the generated run is then not fatal"
    )
    return (
        f"{label}: warm-up with generated inputs failed (every dynamic dimension 1, shapes {shapes}): "
        f"the graph may have a size baked in that these shapes do not fit; {advice}. "
        f"ONNX Runtime said: {type(error).__name__}: {error}"
    )
