"""The pipeline plug-in contract: Python steps around batched ONNX models, served like models."""

from __future__ import annotations

from ortserve.pipeline.contract import JsonObject, ModelCall, ModelOutputs, Pipeline, PipelineContext

__all__ = ["JsonObject", "ModelCall", "ModelOutputs", "Pipeline", "PipelineContext"]
