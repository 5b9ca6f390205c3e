"""``ortserve bench`` / ``replay`` and ``serve --capture-dir`` against real server processes."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner, Result

from ortserve.capture_records import CapturedRequest, read_capture
from ortserve.cli.main import main
from ortserve.demo import DEMO_MODELS, build_mlp
from ortserve.testing import ServerProcess, run_server
from waiting import wait_until

pytestmark = pytest.mark.e2e


def _bench(*args: str) -> Result:
    return CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)


def _levels(path: Path) -> list[dict[str, object]]:
    levels: list[dict[str, object]] = json.loads(path.read_text())["levels"]
    return levels


def test_closed_loop_measures_each_concurrency(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "closed.json"
    result = _bench(
        server.http_url, "-m", "small_mlp", "-c", "1,4", "-n", "150", "--warmup", "0.2", "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    levels = _levels(out)
    assert [level["label"] for level in levels] == ["concurrency 1", "concurrency 4"]
    for level in levels:
        summary = level["summary"]
        assert isinstance(summary, dict)
        assert summary["requests"] == 150 and summary["errors"] == 0
        assert (
            0 < summary["latency_ms"]["p50"] <= summary["latency_ms"]["p99"] <= summary["latency_ms"]["max"]
        )
    assert "concurrency 4" in result.output and "p99" in result.output


def test_open_loop_achieves_the_requested_rate(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "open.json"
    result = _bench(
        server.http_url, "-m", "small_mlp", "--transport", "http-binary", "-r", "100", "--arrivals", "uniform",
        "-d", "2", "--warmup", "0.3", "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = _levels(out)[0]["summary"]
    assert isinstance(summary, dict)
    assert summary["errors"] == 0
    assert summary["achieved_rate"] == pytest.approx(100, rel=0.05)
    document = json.loads(out.read_text())
    assert document["environment"]["ortserve"] and document["settings"]["rate"] == [100.0]


def test_slo_exit_code_says_whether_the_objectives_held(server: ServerProcess) -> None:
    common = (server.http_url, "-m", "small_mlp", "-c", "2", "-n", "60", "--warmup", "0")
    met = _bench(*common, "--slo", "p99=10s", "--slo", "error_rate=0.1%")
    missed = _bench(*common, "--slo", "p99=1us")
    assert met.exit_code == 0, met.output
    assert "PASS" in met.output
    assert missed.exit_code == 3, missed.output
    assert "FAIL" in missed.output


def test_bench_reports_a_model_that_does_not_exist(server: ServerProcess) -> None:
    result = _bench(server.http_url, "-m", "no_such_model", "-n", "5")
    assert result.exit_code == 1 and "cannot read the metadata" in result.output


def test_grpc_transport_loads_the_model_and_names_grpc_failures(
    server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "grpc.json"
    ok = _bench(
        server.grpc_address, "--transport", "grpc", "-m", "small_mlp", "-c", "2", "-n", "50", "-o", str(out)
    )
    assert ok.exit_code == 0, ok.output
    summary = _levels(out)[0]["summary"]
    assert isinstance(summary, dict) and summary["statuses"] == {"200": 50}
    wrong = _bench(
        server.grpc_address, "--transport", "grpc", "-m", "small_mlp", "--shape", "input=1,63", "-n", "5",
        "--slo", "error_rate=0%",
    )  # fmt: skip
    assert wrong.exit_code == 3 and "grpc_INVALID_ARGUMENT: 5" in wrong.output


def test_inputs_come_from_npz_and_jsonl_files(server: ServerProcess, tmp_path: Path) -> None:
    npz = tmp_path / "inputs.npz"
    np.savez(npz, input=np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32))
    jsonl = tmp_path / "requests.jsonl"
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}
    jsonl.write_text(json.dumps(body) + "\n" + json.dumps(body) + "\n")
    for args in (["--input-file", str(npz), "--batch-size", "2", "--transport", "http-binary"],
                 ["--input-file", str(jsonl)]):  # fmt: skip
        result = _bench(
            server.http_url, "-m", "small_mlp", "-n", "20", "--warmup", "0", "--slo", "error_rate=0%", *args
        )
        assert result.exit_code == 0, result.output


def _repository(root: Path, seed: int) -> Path:
    sizes, _ = DEMO_MODELS["small_mlp"]
    version = root / "small_mlp" / "1"
    version.mkdir(parents=True)
    onnx.save(build_mlp(sizes, seed, "small_mlp"), str(version / "model.onnx"))
    return root


@pytest.fixture(scope="module")
def capturing_pair(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, ServerProcess, Path]]:
    """Two capturing servers: ``a`` serves the demo small_mlp, ``b`` one with other weights."""
    root = tmp_path_factory.mktemp("capture")
    captures = root / "a-capture", root / "b-capture"
    repos = _repository(root / "a", DEMO_MODELS["small_mlp"][1]), _repository(root / "b", 7)
    args = [["--capture-dir", str(c), "--capture-rate", "1.0", "--grpc-port", "-1"] for c in captures]
    with (
        run_server(repos[0], root / "a.log", args[0], wait=False) as a,
        run_server(repos[1], root / "b.log", args[1], wait=False) as b,
    ):
        a.wait_ready()
        b.wait_ready()
        yield a, b, root


def _wait_for_records(directory: Path, count: int, timeout_s: float = 20.0) -> list[CapturedRequest]:
    """The capture's records once ``count`` are written (the writer works in the background)."""

    def records() -> list[CapturedRequest] | None:
        try:
            found = list(read_capture([directory])) if directory.exists() else []
        except ValueError:  # a record half written
            return None
        return found if len(found) >= count else None

    return wait_until(records, timeout_s, f"{count} captured records")


@pytest.fixture(scope="module")
def captured(capturing_pair: tuple[ServerProcess, ServerProcess, Path]) -> Path:
    """A capture of 40 JSON and 40 binary requests to server ``a``, copied aside."""
    a, _, root = capturing_pair
    for transport in ("http-json", "http-binary"):
        result = _bench(
            a.http_url, "-m", "small_mlp", "--transport", transport, "-c", "4", "-n", "40", "--warmup", "0"
        )
        assert result.exit_code == 0, result.output
    assert len(_wait_for_records(root / "a-capture", 80)) == 80
    copy = root / "snapshot"
    shutil.copytree(root / "a-capture", copy)
    return copy


def _post(url: str, record: CapturedRequest) -> tuple[int, bytes]:
    request = urllib.request.Request(url + record.path, record.body, dict(record.headers), method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status, reply.read()


def test_capture_does_not_change_responses(
    capturing_pair: tuple[ServerProcess, ServerProcess, Path], captured: Path, server: ServerProcess
) -> None:
    a, _, _ = capturing_pair  # capturing every request; ``server`` serves the same model without capture
    records = list(read_capture([captured]))
    binary = [r for r in records if "inference-header-content-length" in dict(r.headers)]
    json_only = [r for r in records if r not in binary]
    for record in (binary[0], json_only[0]):
        assert _post(a.http_url, record) == _post(server.http_url, record)


def test_replay_sends_the_captured_bytes_unchanged(
    capturing_pair: tuple[ServerProcess, ServerProcess, Path], captured: Path
) -> None:
    _, b, root = capturing_pair
    result = CliRunner().invoke(main, ["replay", str(captured), "--target", b.http_url, "--speed", "4"])
    assert result.exit_code == 0, result.output
    original = list(read_capture([captured]))
    replayed = _wait_for_records(root / "b-capture", len(original))
    assert len(replayed) == len(original) == 80
    key = lambda r: (r.body, r.headers)  # noqa: E731
    assert sorted(map(key, replayed)) == sorted(map(key, original))
    assert {r.status for r in replayed} == {200}
    binary = [r for r in original if "inference-header-content-length" in dict(r.headers)]
    assert len(binary) == 40


def test_replay_keeps_the_recorded_pace_scaled_by_speed(
    capturing_pair: tuple[ServerProcess, ServerProcess, Path], captured: Path, tmp_path: Path
) -> None:
    a, _, _ = capturing_pair
    records = list(read_capture([captured]))
    span = max(r.arrival for r in records) - min(r.arrival for r in records)
    out = tmp_path / "replay.json"
    started = time.monotonic()
    result = CliRunner().invoke(
        main, ["replay", str(captured), "-t", a.http_url, "--speed", "0.5", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started >= 2 * span * 0.9
    assert _levels(out)[0]["summary"]["requests"] == 80  # type: ignore[index]


def test_compare_mode_finds_a_different_model_and_none_against_itself(
    capturing_pair: tuple[ServerProcess, ServerProcess, Path], captured: Path, tmp_path: Path
) -> None:
    a, b, _ = capturing_pair
    outputs = {}
    for name, second in (("self", a), ("other", b)):
        out = tmp_path / f"{name}.json"
        args = [
            "replay",
            str(captured),
            "-t",
            a.http_url,
            "--compare",
            second.http_url,
            "--speed",
            "8",
            "-o",
            str(out),
        ]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        outputs[name] = json.loads(out.read_text())["settings"]["comparison"]["outputs"]["output"]
    assert outputs["self"]["max_abs_error"] == 0.0 and outputs["self"]["top1_agreement"] == 1.0
    assert outputs["other"]["max_abs_error"] > 0.01
    assert outputs["other"]["top1_agreement"] < 0.9
    assert outputs["other"]["compared"] == 80


def test_bench_loads_an_application_route_with_its_bodies(server: ServerProcess, tmp_path: Path) -> None:
    bodies = tmp_path / "bodies.jsonl"
    queries = ["国庆旅游攻略", "天气", "guoqing", "火锅"]
    lines = [json.dumps({"query": q, "region_id": 110000, "timestamp": 1759017600000}) for q in queries]
    bodies.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "route.json"
    result = _bench(
        server.http_url, "--route", "/v1/predict", "--body-file", str(bodies), "-c", "2", "-n", "40",
        "--warmup", "0", "--slo", "error_rate=0%", "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["settings"]["route"] == "/v1/predict"
    summary = document["levels"][0]["summary"]
    assert summary["requests"] == 40 and summary["errors"] == 0


def test_bench_refuses_a_route_without_json_bodies(server: ServerProcess, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "x"}\n[1, 2]\n', encoding="utf-8")
    no_file = _bench(server.http_url, "--route", "/v1/predict", "-n", "5")
    assert no_file.exit_code != 0 and "--body-file" in no_file.output
    not_object = _bench(server.http_url, "--route", "/v1/predict", "--body-file", str(bad), "-n", "5")
    assert not_object.exit_code != 0 and "bad.jsonl:2" in not_object.output
    no_model = _bench(server.http_url, "-n", "5")
    assert no_model.exit_code != 0 and "--model is required" in no_model.output
