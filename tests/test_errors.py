"""The error tree: every class owns one HTTP status and one gRPC code, and they agree."""

from __future__ import annotations

import inspect

import pytest

from ortserve import errors

TABLE = {
    errors.OrtServeError: (500, "INTERNAL"),
    errors.InvalidInput: (400, "INVALID_ARGUMENT"),
    errors.InvalidField: (400, "INVALID_ARGUMENT"),
    errors.PayloadTooLarge: (413, "RESOURCE_EXHAUSTED"),
    errors.UnsupportedEncoding: (415, "UNIMPLEMENTED"),
    errors.ModelNotFound: (404, "NOT_FOUND"),
    errors.ModelNotReady: (503, "UNAVAILABLE"),
    errors.Overloaded: (429, "RESOURCE_EXHAUSTED"),
    errors.DeadlineExceeded: (504, "DEADLINE_EXCEEDED"),
    errors.DeadlineUnmeetable: (504, "DEADLINE_EXCEEDED"),
    errors.DeadlineUnmeetable: (504, "DEADLINE_EXCEEDED"),
    errors.NotImplementedByServer: (501, "UNIMPLEMENTED"),
    errors.ModelControlDisabled: (503, "UNAVAILABLE"),
    errors.ModelLoadFailed: (400, "INVALID_ARGUMENT"),
    errors.PermissionDenied: (403, "PERMISSION_DENIED"),
    errors.Unauthenticated: (401, "UNAUTHENTICATED"),
    errors.InternalError: (500, "INTERNAL"),
    errors.InferenceError: (500, "INTERNAL"),
    errors.RepositoryError: (500, "INTERNAL"),
    errors.ConfigError: (400, "INVALID_ARGUMENT"),
}


def test_every_error_class_is_in_the_table() -> None:
    defined = {
        obj for _, obj in inspect.getmembers(errors, inspect.isclass) if issubclass(obj, errors.OrtServeError)
    }
    assert defined == set(TABLE)


@pytest.mark.parametrize(("error_class", "codes"), TABLE.items())
def test_status_and_code(error_class: type[errors.OrtServeError], codes: tuple[int, str]) -> None:
    assert (error_class.http_status, error_class.grpc_code) == codes


def test_overloaded_carries_retry_after() -> None:
    assert errors.Overloaded("busy", retry_after_s=2.5).retry_after_s == 2.5


@pytest.mark.parametrize("cls", [errors.InvalidInput, errors.ModelLoadFailed, errors.Overloaded])
def test_a_message_is_clipped_however_it_was_built(cls: type[errors.OrtServeError]) -> None:
    # Whatever a message quotes (a client's field, a model's names), the answer, the log line and
    # the trace attribute built from it stay bounded.
    error = cls("field " + "y" * 50_000)
    assert len(error.message) < errors.MAX_MESSAGE_CHARS + 64
    assert error.message.endswith(f"({50_006 - errors.MAX_MESSAGE_CHARS} more characters)")
    assert str(error) == error.message
    assert cls("short").message == "short"
