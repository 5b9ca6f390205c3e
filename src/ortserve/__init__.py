"""ortserve: serve ONNX models over the Open Inference Protocol with low, predictable latency."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
