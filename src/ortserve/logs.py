"""Logging set up once at the CLI edge: text or JSON lines, tagged with the request's context.

A record logged while a request is handled carries its id, model and version, and its trace
and span ids when the request is traced (W3C hex, as OpenTelemetry exporters write them). In
JSON an access-log line's transport, status, outcome and latency are keys of their own.
ONNX Runtime's own logger is set to match (ort_runtime.py): nothing it writes escapes the
format.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from contextvars import ContextVar
from types import TracebackType

from ortserve.errors import clip_text
from ortserve.ort_runtime import ORT_LOG_FIELDS

__all__ = [
    "ACCESS_FIELDS",
    "MODEL",
    "REQUEST_ID",
    "TRACE",
    "VERSION",
    "configure_logging",
    "escape_line",
    "make_formatter",
]

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
"""The request being handled by the current task (OIP ``id`` or ``X-Request-ID``)."""
MODEL: ContextVar[str | None] = ContextVar("model", default=None)
VERSION: ContextVar[str | None] = ContextVar("version", default=None)
TRACE: ContextVar[tuple[str, str] | None] = ContextVar("trace", default=None)
"""(trace_id, span_id) of the traced request being handled, hex."""
_CONTEXT = (("request_id", REQUEST_ID), ("model", MODEL), ("version", VERSION))
_TRACE_KEYS = ("trace_id", "span_id")
ACCESS_FIELDS = ("transport", "status", "outcome", "latency_ms")
"""An access-log record's ``extra`` keys, written as JSON keys of their own."""
_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


class _RequestContext(logging.Filter):
    """Copies the request's context variables onto every record logged while handling it."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, var in _CONTEXT:
            if getattr(record, key, None) is None:
                setattr(record, key, var.get())
        if getattr(record, "trace_id", None) is None:
            ids = TRACE.get()
            record.trace_id, record.span_id = ids if ids is not None else (None, None)
        return True


# Characters that could end a log line or forge the look of another one: C0 and C1 controls,
# DEL, the Unicode line and paragraph separators, and lone surrogates (not text at all).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _json_escaped(char: re.Match[str]) -> str:
    return f"\\u{ord(char.group()):04x}"


def _escaped(char: re.Match[str]) -> str:
    code = ord(char.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_line(text: str) -> str:
    """``text`` with every line-breaking or control character written as a visible escape."""
    return _UNSAFE.sub(_escaped, text) if _UNSAFE.search(text) else text


MAX_MESSAGE_CHARS = 16_384
"""A log message longer than this is cut, saying how much was left out: a message that joins
what a client sent (every key of a config) made 20 MB lines."""


def bounded_message(text: str) -> str:
    """``text`` cut to :data:`MAX_MESSAGE_CHARS`."""
    return clip_text(text, MAX_MESSAGE_CHARS)


_TAG_UNSAFE = re.compile(r'[\s"=\[\]]')


def tag_value(value: object) -> str:
    """A ``key=value`` tag's value, quoted (``"`` written ``\\"``) when it holds a space, a
    quote, ``=`` or a bracket: a request id ``x model=y`` must not read as two fields."""
    text = escape_line(str(value))
    if text and not _TAG_UNSAFE.search(text):
        return text
    return '"' + text.replace('"', '\\"') + '"'


class _TextFormatter(logging.Formatter):
    """One line per record whatever the message holds; a traceback follows, indented.

    Messages and tags carry client-supplied strings (request ids, model names, error texts), so
    the whole message is escaped here rather than each field where it is logged.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_line(bounded_message(record.message))
        line = super().formatMessage(record)
        tags = [
            f"{key}={tag_value(value)}"
            for key in (*(key for key, _ in _CONTEXT), *_TRACE_KEYS)
            if (value := getattr(record, key, None)) is not None
        ]
        return f"{line} [{' '.join(tags)}]" if tags else line

    def formatException(self, ei: _ExcInfo) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(block: str) -> str:
    """Every line of a traceback starts with "  | ": an exception message cannot start a line."""
    return "\n".join("  | " + escape_line(line) for line in block.splitlines())


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": bounded_message(record.getMessage()),
        }
        for key in ("request_id", "model", "version", *_TRACE_KEYS, *ACCESS_FIELDS, *ORT_LOG_FIELDS):
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        line = json.dumps(entry, ensure_ascii=False)
        # JSON leaves C1 controls, the Unicode line separators and lone surrogates as they
        # are; log readers break lines on some of them (the text format escapes them too).
        return _JSON_UNSAFE.sub(_json_escaped, line) if _JSON_UNSAFE.search(line) else line


def make_formatter(fmt: str) -> logging.Formatter:
    """The formatter of log lines in ``text`` or ``json`` format."""
    if fmt == "json":
        return _JsonFormatter()
    return _TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def configure_logging(level: str = "INFO", fmt: str = "text", onnxruntime: bool = True) -> None:
    """Send logs to stderr in ``text`` or ``json`` format; replaces earlier handlers, and routes
    ONNX Runtime's own log messages through them (ort_runtime.py) unless ``onnxruntime`` is
    False: the supervisor of ``--workers`` must not import ONNX Runtime (it forks the zygote,
    which refuses to start with ONNX Runtime already imported)."""
    from ortserve.ort_runtime import route_onnxruntime_logs

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(fmt))
    handler.addFilter(_RequestContext())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if onnxruntime:
        route_onnxruntime_logs(level)
    # What Python itself would print to stderr goes through the log too (one JSON object per
    # line under json): warnings, and exceptions no thread caught.
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("ortserve.threads").error(
        "uncaught exception in thread %s", name, exc_info=args.exc_value or True
    )
