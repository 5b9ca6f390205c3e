"""Text log lines: a field's value cannot forge another field, and no line is unbounded."""

from __future__ import annotations

import logging

from ortserve.logs import MAX_MESSAGE_CHARS, make_formatter


def _line(message: str, **tags: object) -> str:
    record = logging.LogRecord("ortserve.access", logging.INFO, __file__, 1, message, None, None)
    for key, value in tags.items():
        setattr(record, key, value)
    return make_formatter("text").format(record)


def test_a_request_id_with_spaces_cannot_forge_access_log_fields() -> None:
    line = _line("http infer m/1 200 ok 1.000 ms", request_id='x model=evil version=9] "', model="m")
    tags = line[line.rindex(" [") :]
    assert tags == ' [request_id="x model=evil version=9] \\"" model=m]'
    assert _line("ok", request_id="plain-id_1").endswith("[request_id=plain-id_1]")


def test_every_message_is_bounded_in_both_formats() -> None:
    huge = "k, " * 1_000_000
    assert len(_line(huge)) < MAX_MESSAGE_CHARS + 200
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, huge, None, None)
    assert len(make_formatter("json").format(record)) < MAX_MESSAGE_CHARS + 300
