"""The start-up warning about model control that anyone on the network could use."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ortserve.server.lifecycle import _warn_unrestricted
from ortserve.settings import ServerSettings


@pytest.mark.parametrize(
    ("changes", "warned"),
    [
        ({"host": "0.0.0.0", "model_control_mode": "poll"}, True),
        (
            {
                "host": "0.0.0.0",
                "model_control_mode": "explicit",
                "http_restricted_api": "model-repository:k=v",
            },
            True,
        ),
        (
            {
                "host": "0.0.0.0",
                "model_control_mode": "explicit",
                "http_restricted_api": "model-repository:k=v",
                "grpc_restricted_protocol": "model-repository:k=v",
            },
            False,
        ),
        (
            {
                "host": "0.0.0.0",
                "model_control_mode": "poll",
                "http_restricted_api": "model-repository:k=v",
                "grpc_port": -1,
            },
            False,
        ),
        ({"host": "0.0.0.0", "model_control_mode": "none"}, False),
        ({"host": "127.0.0.1", "model_control_mode": "explicit"}, False),
    ],
)
def test_model_control_on_a_public_address_without_a_restriction_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, changes: dict[str, object], warned: bool
) -> None:
    settings = ServerSettings(tmp_path, **changes)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        _warn_unrestricted(settings)
    found = [r.getMessage() for r in caplog.records if "anyone who reaches the server" in r.getMessage()]
    assert bool(found) == warned
