"""Moved: traffic capture is a server feature now, :mod:`ortserve.capture` (beside telemetry),
its record format and reader :mod:`ortserve.capture_records`.

Kept so that code written against the old path still imports; new code imports
``ortserve.capture`` and ``ortserve.capture_records``.
"""

from __future__ import annotations

from ortserve.capture import Capture, CaptureCollector
from ortserve.capture_records import MAGIC, CapturedRequest, read_capture

__all__ = ["MAGIC", "Capture", "CaptureCollector", "CapturedRequest", "read_capture"]
