"""Quantized candidates: FP16 and INT8 (dynamic, static) versions of a repository model,
with size, latency and divergence against the source (``ortserve quantize``)."""

__all__: list[str] = []
