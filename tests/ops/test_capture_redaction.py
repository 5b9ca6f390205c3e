"""Privacy-safe capture: listed JSON paths and headers are hashed (HMAC, the same value the same
token) or dropped before a record is queued; binary-extension bodies keep their tensors; an
unreadable body is not captured; on a real server no listed value reaches the disk and the
redacted capture replays."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import orjson
import pytest

from model_builders import write_scaled_version
from ortserve.capture_records import CapturedRequest
from ortserve.capture_redaction import Redactor, load_redactor, parse_path
from ortserve.testing import run_server

SECRET = b"0123456789abcdef-capture-key"


def record(
    body: bytes, headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),)
) -> CapturedRequest:
    return CapturedRequest(1.0, 2.0, "/v2/models/m/infer", "m", None, headers, body, 200, 0.001)


def redactor(**paths: list[str]) -> Redactor:
    return Redactor(
        SECRET,
        tuple(parse_path(p) for p in paths.get("hash", [])),
        tuple(parse_path(p) for p in paths.get("drop", [])),
        frozenset(paths.get("hash_headers", [])),
        frozenset(paths.get("drop_headers", [])),
    )


def test_paths_read_keys_and_every_element_and_refuse_what_they_cannot() -> None:
    assert parse_path("inputs[*].data") == ("inputs", None, "data")
    assert parse_path("a.b") == ("a", "b")
    for bad in ("", "[*]", "a[0]", "a..b"):
        with pytest.raises(ValueError):
            parse_path(bad)


def test_listed_fields_are_hashed_element_by_element_or_dropped_and_the_same_value_keeps_its_token() -> None:
    body = orjson.dumps(
        {
            "inputs": [{"name": "q", "datatype": "BYTES", "shape": [2], "data": ["alice", "beijing"]}],
            "parameters": {"user_id": "alice", "address": "1 Main St", "keep": 3},
        }
    )
    redact = redactor(hash=["inputs[*].data", "parameters.user_id"], drop=["parameters.address"])
    first = redact(record(body))
    assert first is not None
    document = orjson.loads(first.body)
    data = document["inputs"][0]["data"]
    assert len(data) == 2 and all(v.startswith("h:") for v in data)
    assert document["parameters"]["user_id"] == data[0]  # "alice" both times: one token
    assert "address" not in document["parameters"] and document["parameters"]["keep"] == 3
    assert b"alice" not in first.body and b"Main St" not in first.body
    other = Redactor(b"another-secret-of-16+", redact.hashed)
    assert orjson.loads(other(record(body)).body)["inputs"][0]["data"][0] != data[0]  # type: ignore[union-attr]


def test_a_binary_body_keeps_its_tensors_and_its_header_length_follows_the_json() -> None:
    head = orjson.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}
            ],
            "parameters": {"user_id": "bob"},
        }
    )
    tensor = b"\x00\x00\x80?"
    headers = (
        ("content-type", "application/octet-stream"),
        ("inference-header-content-length", str(len(head))),
    )
    redacted = redactor(hash=["parameters.user_id"])(record(head + tensor, headers))
    assert redacted is not None
    length = int(dict(redacted.headers)["inference-header-content-length"])
    assert redacted.body[length:] == tensor
    assert orjson.loads(redacted.body[:length])["parameters"]["user_id"].startswith("h:")


def test_headers_are_hashed_or_dropped_and_an_unreadable_body_is_not_kept() -> None:
    headers = (("content-type", "application/json"), ("x-user-id", "carol"), ("authorization", "Bearer k"))
    redacted = redactor(hash_headers=["x-user-id"], drop_headers=["authorization"])(record(b"{}", headers))
    assert redacted is not None
    kept = dict(redacted.headers)
    assert kept["x-user-id"].startswith("h:") and "authorization" not in kept
    assert redactor(hash=["a"])(record(b"not json")) is None


def test_a_policy_file_needs_a_long_enough_secret_and_known_keys(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_bytes(b"short")
    policy = tmp_path / "redact.yaml"
    policy.write_text(f"secret_file: {secret}\nhash: [a.b]\n", encoding="utf-8")
    with pytest.raises(ValueError, match="16 bytes"):
        load_redactor(policy)
    secret.write_bytes(SECRET)
    assert load_redactor(policy).hashed == (("a", "b"),)
    policy.write_text(f"secret_file: {secret}\nhashes: [a]\n", encoding="utf-8")
    with pytest.raises(ValueError):
        load_redactor(policy)


@pytest.mark.e2e
def test_no_listed_value_reaches_the_disk_and_the_redacted_capture_replays(tmp_path: Path) -> None:
    write_scaled_version(tmp_path / "models", "m", 1, 2.0)
    (tmp_path / "key").write_bytes(SECRET)
    policy = tmp_path / "redact.yaml"
    policy.write_text(
        f"secret_file: {tmp_path / 'key'}\nhash: [parameters.user_id]\ndrop: [parameters.address]\n"
    )
    capture = tmp_path / "capture"
    args = [
        "--capture-dir",
        str(capture),
        "--capture-rate",
        "1",
        "--capture-redact",
        str(policy),
        "--intra-op-threads",
        "1",
    ]
    secrets = [f"user-{n}-very-private" for n in range(5)]
    with run_server(tmp_path / "models", tmp_path / "server.log", args) as server:
        for n, user in enumerate(secrets * 2):
            body = {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [n, 1, 2, 3]}],
                "parameters": {"user_id": user, "address": f"{n} Secret Road"},
            }
            request = urllib.request.Request(
                f"{server.http_url}/v2/models/m/infer",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as reply:
                assert reply.status == 200
        server.stop()
        files = sorted(capture.glob("*.ocap"))
        raw = b"".join(f.read_bytes() for f in files)
        assert raw and all(s.encode() not in raw for s in secrets) and b"Secret Road" not in raw
        assert raw.count(b'"user_id":"h:') == 10
    with run_server(
        tmp_path / "models", tmp_path / "replay-server.log", ["--intra-op-threads", "1"]
    ) as target:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "ortserve",
                "replay",
                str(capture),
                "--target",
                target.http_url,
                "--speed",
                "50",
                "-o",
                str(tmp_path / "replay.json"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        summary = json.loads((tmp_path / "replay.json").read_text())["levels"][0]["summary"]
        assert (summary["requests"], summary["errors"]) == (10, 0)
