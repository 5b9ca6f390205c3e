"""Model control end to end with tritonclient (HTTP and gRPC): repository index, load, unload,
model configuration, restricted API, control modes, SIGHUP, and reloads under load."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from model_builders import scaled_model, write_scaled_version
from ortserve.repository.signature import generate_key, sign_version
from ortserve.repository.snapshot import COMPLETE_MARKER
from ortserve.testing import ServerProcess, run_server
from waiting import wait_until

pytestmark = pytest.mark.e2e

HEADER = {"x-control-key": "s3cret"}
X = np.ones((1, 4), dtype=np.float32)


def http_scale(server: ServerProcess, model: str = "m") -> tuple[str, float]:
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client:
        tensor = httpclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(X)
        result = client.infer(model, [tensor])
        return result.get_response()["model_version"], float(result.as_numpy("y")[0, 0])


def ready_versions(server: ServerProcess, model: str = "m") -> set[str]:
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client:
        return {
            row["version"]
            for row in client.get_model_repository_index()
            if row["name"] == model and row.get("state") == "READY"
        }


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("explicit-models")
    write_scaled_version(root, "m", 1, 1.0)
    write_scaled_version(root, "idle", 1, 7.0)
    log = tmp_path_factory.mktemp("explicit-logs") / "server.log"
    args = [
        "--model-control-mode",
        "explicit",
        "--load-model",
        "m",
        "--http-restricted-api",
        "model-repository:X-Control-Key=s3cret",
        "--grpc-restricted-protocol",
        "model-repository:x-control-key=s3cret",
        "--intra-op-threads",
        "1",
    ]
    with run_server(root, log, args) as server:
        yield server, root


def test_explicit_mode_loads_only_the_named_models_and_lists_the_rest(
    explicit_server: tuple[ServerProcess, Path],
) -> None:
    server, _ = explicit_server
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client:
        index = {row["name"]: row for row in client.get_model_repository_index(headers=HEADER)}
        assert index["m"]["state"] == "READY" and index["idle"]["state"] == "UNAVAILABLE"
        assert not client.is_model_ready("idle")


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_load_config_and_unload_over_both_transports(
    explicit_server: tuple[ServerProcess, Path], transport: str
) -> None:
    server, _ = explicit_server
    client: Any
    if transport == "http":
        client = httpclient.InferenceServerClient(server.http_address)
    else:
        client = grpcclient.InferenceServerClient(server.grpc_address)
    with contextlib.closing(client):
        client.load_model("idle", headers=HEADER)
        assert client.is_model_ready("idle")
        config = client.get_model_config("idle")
        if transport == "grpc":
            config = {
                "max_batch_size": config.config.max_batch_size,
                "input": [{"name": config.config.input[0].name}],
            }
        assert config["max_batch_size"] == 32 and config["input"][0]["name"] == "x"
        names = {row["name"] if isinstance(row, dict) else row.name for row in _index(client)}
        assert {"m", "idle"} <= names
        client.unload_model("idle", headers=HEADER)
        wait_until(lambda: not client.is_model_ready("idle"))
        client.load_model("idle", headers=HEADER, config='{"max_batch_size": 4}')
        config = (
            client.get_model_config("idle", as_json=True)
            if transport == "grpc"
            else client.get_model_config("idle")
        )
        assert int((config.get("config") or config)["max_batch_size"]) == 4
        client.unload_model("idle", headers=HEADER)


def _index(client: Any) -> list[Any]:
    if isinstance(client, httpclient.InferenceServerClient):
        return list(client.get_model_repository_index(headers=HEADER))
    return list(client.get_model_repository_index(headers=HEADER).models)


def test_repository_calls_without_the_header_are_refused(explicit_server: tuple[ServerProcess, Path]) -> None:
    server, _ = explicit_server
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as http:
        with pytest.raises(InferenceServerException, match="restricted") as refused:
            http.load_model("idle")
        assert refused.value.status() == "403"
        with pytest.raises(InferenceServerException, match="restricted"):
            http.get_model_repository_index(headers={"x-control-key": "wrong"})
    with contextlib.closing(grpcclient.InferenceServerClient(server.grpc_address)) as grpc_client:
        with pytest.raises(InferenceServerException) as caught:
            grpc_client.unload_model("m")
        assert caught.value.status() == "StatusCode.PERMISSION_DENIED"
    assert http_scale(server) == ("1", 1.0)


def test_a_failed_load_keeps_the_old_version_serving(explicit_server: tuple[ServerProcess, Path]) -> None:
    server, root = explicit_server
    (root / "m" / "9").mkdir()
    (root / "m" / "9" / "model.onnx").write_bytes(b"garbage")
    try:
        with contextlib.closing(grpcclient.InferenceServerClient(server.grpc_address)) as client:
            with pytest.raises(InferenceServerException, match="version 9") as caught:
                client.load_model("m", headers=HEADER)
            assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
            rows = {
                (r.version, r.state)
                for r in client.get_model_repository_index(headers=HEADER).models
                if r.name == "m"
            }
            assert ("1", "READY") in rows and ("9", "UNAVAILABLE") in rows
        assert http_scale(server) == ("1", 1.0)
        assert "model m version 9 failed to load" in server.log()
    finally:
        (root / "m" / "9" / "model.onnx").unlink()
        (root / "m" / "9").rmdir()


def test_none_mode_refuses_load_and_unload_but_answers_index_and_config(server: ServerProcess) -> None:
    with contextlib.closing(grpcclient.InferenceServerClient(server.grpc_address)) as client:
        with pytest.raises(InferenceServerException, match="model control mode is 'none'") as caught:
            client.load_model("small_mlp")
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert client.get_model_config("small_mlp").config.max_batch_size == 32
        assert "small_mlp" in {m.name for m in client.get_model_repository_index().models}
    with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as http:
        with pytest.raises(InferenceServerException, match="not allowed") as refused:
            http.unload_model("small_mlp")
        assert refused.value.status() == "503"
        config = http.get_model_config("small_mlp", "1")
        assert config["platform"] == "onnxruntime_onnx" and config["input"][0]["dims"] == ["64"]
        assert http.is_model_ready("small_mlp")


@pytest.fixture
def poll_server(tmp_path: Path) -> Iterator[ServerProcess]:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    args = ["--model-control-mode", "poll", "--repository-poll-secs", "0.3", "--intra-op-threads", "1"]
    with run_server(tmp_path, tmp_path / "server.log", args) as server:
        yield server


def test_poll_mode_never_loads_a_half_copied_version_and_serves_it_once_complete(
    poll_server: ServerProcess, tmp_path: Path
) -> None:
    data = scaled_model(2.0).SerializeToString()
    target = tmp_path / "m" / "2"
    target.mkdir()
    with (target / "model.onnx").open("wb") as slow:
        for start in range(0, len(data), max(len(data) // 8, 1)):  # ~8 chunks over ~2.4 poll periods
            slow.write(data[start : start + max(len(data) // 8, 1)])
            slow.flush()
            time.sleep(0.1)  # real time: the server's own poll timer must land between the chunks
            assert http_scale(poll_server) == ("1", 1.0)
    assert http_scale(poll_server) == ("1", 1.0)  # written whole, but not marked complete
    (target / COMPLETE_MARKER).touch()
    wait_until(lambda: http_scale(poll_server) == ("2", 2.0), 10.0)  # how soon is a benchmark's
    wait_until(lambda: ready_versions(poll_server) == {"2"})
    assert "failed to load" not in poll_server.log()


def test_sighup_rescans_in_none_mode_and_keeps_serving(tmp_path: Path) -> None:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    with run_server(tmp_path, tmp_path / "server.log", ["--intra-op-threads", "1"]) as server:
        (write_scaled_version(tmp_path, "m", 2, 2.0) / COMPLETE_MARKER).touch()
        server.process.send_signal(signal.SIGHUP)
        wait_until(lambda: http_scale(server) == ("2", 2.0))
        assert server.process.poll() is None
        assert "SIGHUP: re-scanning" in server.log()


def test_reloads_under_concurrent_load_fail_no_request(tmp_path: Path) -> None:
    """Every request succeeds, answered by the version that was ready when it was sent or a newer one."""
    write_scaled_version(tmp_path, "m", 1, 1.0)
    args = ["--model-control-mode", "explicit", "--load-model", "*", "--intra-op-threads", "1"]
    with run_server(tmp_path, tmp_path / "server.log", args) as server:
        newest_ready = [1]
        failures: list[str] = []
        answered = [0]
        seen: set[int] = set()
        stop = threading.Event()

        def hammer() -> None:
            with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client:
                tensor = httpclient.InferInput("x", [1, 4], "FP32")
                tensor.set_data_from_numpy(X)
                while not stop.is_set():
                    floor = newest_ready[0]
                    try:
                        result = client.infer("m", [tensor])
                    except InferenceServerException as exc:
                        failures.append(str(exc))
                        continue
                    version = int(result.get_response()["model_version"])
                    if float(result.as_numpy("y")[0, 0]) != version or version < floor:
                        failures.append(
                            f"version {version} answered {result.as_numpy('y')[0, 0]} (floor {floor})"
                        )
                    seen.add(version)
                    answered[0] += 1

        def reached(version: int, before: int) -> bool:
            """Traffic goes on through each swap, and reaches the new version (or failed)."""
            return (version in seen and answered[0] >= before + 12) or bool(failures)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as control:
                for version in range(2, 7):
                    write_scaled_version(tmp_path, "m", version, float(version))
                    control.load_model("m")
                    newest_ready[0] = version
                    wait_until(functools.partial(reached, version, answered[0]), 20, f"traffic on {version}")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert failures == []
        assert answered[0] > 50
        assert ready_versions(server) == {"6"}
        url = f"http://{server.host}:{server.metrics_port}/metrics"

        def scrape() -> str:
            with urllib.request.urlopen(url) as reply:
                text: str = reply.read().decode()
                return text

        wait_until(
            lambda: 'ortserve_model_unloads_total{model="m"} 5.0' in scrape()
        )  # drains end after the swap
        assert 'ortserve_model_loads_total{model="m"} 6.0' in scrape()
        assert 'ortserve_model_load_seconds_count{model="m"} 6.0' in scrape()


def test_require_signed_serves_the_signed_version_and_refuses_the_unsigned_one(tmp_path: Path) -> None:
    key = tmp_path / "release"
    generate_key(key)
    root = tmp_path / "models"
    sign_version(write_scaled_version(root, "m", 1, 1.0), key)
    write_scaled_version(root, "m", 2, 2.0)  # newer, but unsigned
    args = [
        "--trusted-keys",
        str(key.with_name("release.pub")),
        "--require-signed",
        "--intra-op-threads",
        "1",
    ]
    with run_server(root, tmp_path / "server.log", args) as server:
        assert http_scale(server) == ("1", 1.0)
        with contextlib.closing(httpclient.InferenceServerClient(server.http_address)) as client:
            rows = {row["version"]: row for row in client.get_model_repository_index() if row["name"] == "m"}
        assert rows["2"]["state"] == "UNAVAILABLE" and "unsigned" in rows["2"]["reason"]
        assert "signature verified" in server.log()
