"""Moved: traffic capture is a server feature now, :mod:`ortserve.capture` (beside telemetry).

Kept so that code written against the old path still imports; new code imports
``ortserve.capture``.
"""

from __future__ import annotations

from ortserve.capture import MAGIC, Capture, CaptureCollector, CapturedRequest, read_capture

__all__ = ["MAGIC", "Capture", "CaptureCollector", "CapturedRequest", "read_capture"]
