"""The soak's traffic: checked clients on every transport and both pipeline routes,
disconnects, slow readers, malformed requests and reloads, each a thread recording one outcome
per request."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from soak_http import CheckedConnection
from soak_pipelines import PipelineTraffic

from ortserve.testing import ServerProcess

POOL_ROWS = 512
"""Distinct input rows; requests draw from them, so identical inputs recur (remembered answers)."""


@dataclass(slots=True)
class Record:
    t: float
    client: str
    outcome: str
    """ok, degraded (answered by a fallback level), refused (429/503 with a reason),
    expected_4xx (a malformed request refused as it should be), lost, wrong."""
    latency_s: float
    level: int = 0


def proc_counts(pid: int) -> tuple[float, int, int]:
    """RSS in MiB, open fds, threads of a process."""
    rss, threads = 0.0, 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


class Clients:
    """Starts every traffic thread; ``records`` holds one entry per request made."""

    def __init__(
        self,
        server: ServerProcess,
        model: str,
        reference: ort.InferenceSession,
        reload_s: float,
        pipelines: dict[str, list[tuple[bytes, object]]] | None = None,
        reload_models: tuple[str, ...] = (),
    ) -> None:
        self.server = server
        self.model = model
        self.reload_models = (model, *reload_models)
        """Reloaded one after the other every ``reload_s`` (a pipeline's model: its pipeline too)."""
        self.reference = reference
        self.reload_s = reload_s
        self.pool = np.random.default_rng(7).uniform(-3, 3, (POOL_ROWS, 64)).astype(np.float32)
        self.expected = reference.run(None, {"input": self.pool})[0]
        self.records: list[Record] = []
        self.examples: dict[str, str] = {}
        self.reloads = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pipelines = (
            None
            if pipelines is None
            else PipelineTraffic(server, pipelines, self._record, self._refused_or_lost, self._stop)
        )

    def start(self) -> None:
        workers = [
            ("http_json", self._http_json),
            ("http_json", self._http_json),
            ("http_binary", self._http_binary),
            ("grpc_unary", self._grpc_unary),
            ("grpc_stream", self._grpc_stream),
            ("disconnect", self._disconnects),
            ("slow_reader", self._slow_reader),
            ("malformed", self._malformed),
            ("reload", self._reloader),
        ]
        if self._pipelines is not None:
            workers += self._pipelines.workers()
        for index, (name, target) in enumerate(workers):
            thread = threading.Thread(
                target=target, args=(name, index), name=f"soak-{name}-{index}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    # -- bookkeeping ------------------------------------------------------------------
    def _record(self, client: str, outcome: str, started: float, level: int = 0, detail: str = "") -> None:
        with self._lock:
            self.records.append(Record(started, client, outcome, time.monotonic() - started, level))
            if detail and outcome not in self.examples:
                self.examples[outcome] = f"{client}: {detail}"[:300]

    def _rows(self, rng: np.random.Generator, most: int = 4) -> np.ndarray:
        return rng.integers(0, POOL_ROWS, int(rng.integers(1, most + 1)))

    def _check(self, client: str, started: float, picked: np.ndarray, answer: np.ndarray, level: int) -> None:
        if answer.shape == (len(picked), 16) and np.allclose(
            answer, self.expected[picked], rtol=1e-4, atol=1e-5
        ):
            self._record(client, "degraded" if level else "ok", started, level)
        else:
            self._record(
                client, "wrong", started, level, f"rows {picked.tolist()} answered {answer.tolist()[:1]}"
            )

    def _refused_or_lost(self, client: str, started: float, status: int, text: str) -> None:
        if status in (429, 503):
            self._record(client, "refused", started, detail=f"{status} {text}")
        else:
            self._record(client, "lost", started, detail=f"{status} {text}")

    # -- checked clients --------------------------------------------------------------
    def _http_json(self, name: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        connection = CheckedConnection(self.server, name, self._record, self._refused_or_lost)
        while not self._stop.is_set():
            picked = self._rows(rng)
            rows = self.pool[picked]
            body = json.dumps(
                {
                    "inputs": [
                        {
                            "name": "input",
                            "datatype": "FP32",
                            "shape": list(rows.shape),
                            "data": rows.reshape(-1).tolist(),
                        }
                    ]
                }
            )
            started = time.monotonic()
            payload = connection.post(f"/v2/models/{self.model}/infer", body, started)
            if payload is None:
                continue
            document = json.loads(payload)
            level = int(document.get("parameters", {}).get("fallback_level", 0))
            answer = np.array(document["outputs"][0]["data"], dtype=np.float32).reshape(
                document["outputs"][0]["shape"]
            )
            self._check(name, started, picked, answer, level)
        connection.close()

    def _http_binary(self, name: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        client = httpclient.InferenceServerClient(self.server.http_address, network_timeout=30)
        while not self._stop.is_set():
            picked = self._rows(rng)
            given = httpclient.InferInput("input", [len(picked), 64], "FP32")
            given.set_data_from_numpy(self.pool[picked], binary_data=True)
            started = time.monotonic()
            try:
                result = client.infer(
                    self.model, [given], outputs=[httpclient.InferRequestedOutput("output", binary_data=True)]
                )
            except Exception as exc:
                self._exception(name, started, exc)
                continue
            level = int(result.get_response().get("parameters", {}).get("fallback_level", 0))
            self._check(name, started, picked, result.as_numpy("output"), level)
        client.close()

    def _grpc_unary(self, name: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        client = grpcclient.InferenceServerClient(self.server.grpc_address)
        while not self._stop.is_set():
            picked = self._rows(rng)
            given = grpcclient.InferInput("input", [len(picked), 64], "FP32")
            given.set_data_from_numpy(self.pool[picked])
            started = time.monotonic()
            try:
                result = client.infer(self.model, [given], client_timeout=30)
            except Exception as exc:
                self._exception(name, started, exc)
                continue
            parameters = result.get_response().parameters
            level = int(parameters["fallback_level"].int64_param) if "fallback_level" in parameters else 0
            self._check(name, started, picked, result.as_numpy("output"), level)
        client.close()

    def _grpc_stream(self, name: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = grpcclient.InferenceServerClient(self.server.grpc_address)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        while not self._stop.is_set():
            picked = self._rows(rng)
            given = grpcclient.InferInput("input", [len(picked), 64], "FP32")
            given.set_data_from_numpy(self.pool[picked])
            started = time.monotonic()
            client.async_stream_infer(self.model, [given])
            try:
                result, error = answers.get(timeout=30)
            except queue.Empty:
                self._record(name, "lost", started, detail="no stream answer in 30 s")
                break
            if error is not None:
                self._exception(name, started, error)
                continue
            parameters = result.get_response().parameters
            level = int(parameters["fallback_level"].int64_param) if "fallback_level" in parameters else 0
            self._check(name, started, picked, result.as_numpy("output"), level)
        client.stop_stream()
        client.close()

    def _exception(self, name: str, started: float, exc: BaseException) -> None:
        text = str(exc)
        if (
            "503" in text
            or "429" in text
            or "UNAVAILABLE" in text
            or "RESOURCE_EXHAUSTED" in text
            or "no usable execution level" in text
        ):
            self._record(name, "refused", started, detail=text)
        else:
            self._record(name, "lost", started, detail=text)

    # -- abuse ------------------------------------------------------------------------
    def _request_bytes(
        self, rows: int, body_override: bytes | None = None, length: int | None = None
    ) -> tuple[bytes, bytes]:
        data = self.pool[:rows]
        body = (
            body_override
            or json.dumps(
                {
                    "inputs": [
                        {
                            "name": "input",
                            "datatype": "FP32",
                            "shape": [rows, 64],
                            "data": data.reshape(-1).tolist(),
                        }
                    ]
                }
            ).encode()
        )
        head = (
            f"POST /v2/models/{self.model}/infer HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
            f"content-length: {length if length is not None else len(body)}\r\n\r\n"
        ).encode()
        return head, body

    def _disconnects(self, name: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not self._stop.wait(0.05):
            head, body = self._request_bytes(4)
            started = time.monotonic()
            try:
                with socket.create_connection((self.server.host, self.server.http_port), timeout=10) as sock:
                    if rng.random() < 0.5:
                        sock.sendall(head + body[: len(body) // 2])  # half a body, then gone
                    else:
                        sock.sendall(head + body)  # a whole request, never read
            except OSError as exc:
                self._record(name, "lost", started, detail=repr(exc))
                continue
            self._record(name, "expected_4xx", started)

    def _slow_reader(self, name: str, seed: int) -> None:
        while not self._stop.is_set():
            head, body = self._request_bytes(32)
            started = time.monotonic()
            try:
                with socket.create_connection((self.server.host, self.server.http_port), timeout=30) as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    sock.sendall(head + body)
                    received = self._read_slowly(sock)
            except OSError as exc:
                self._record(name, "lost", started, detail=repr(exc))
                continue
            status_line, _, rest = received.partition(b"\r\n")
            status = int(status_line.split()[1]) if status_line.startswith(b"HTTP/1.1") else 0
            _, _, payload = rest.partition(b"\r\n\r\n")
            if status != 200:
                self._refused_or_lost(name, started, status, payload.decode(errors="replace"))
                continue
            document = json.loads(payload)
            level = int(document.get("parameters", {}).get("fallback_level", 0))
            answer = np.array(document["outputs"][0]["data"], dtype=np.float32).reshape(32, 16)
            self._check(name, started, np.arange(32), answer, level)

    @staticmethod
    def _read_slowly(sock: socket.socket) -> bytes:
        received = b""
        length: int | None = None
        while True:
            chunk = sock.recv(64)
            if not chunk:
                return received
            received += chunk
            if length is None and b"\r\n\r\n" in received:
                header = received.split(b"\r\n\r\n", 1)[0].lower()
                for line in header.split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
            if length is not None and len(received.split(b"\r\n\r\n", 1)[1]) >= length:
                return received
            time.sleep(0.02)

    def _malformed(self, name: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        cases: list[tuple[str, bytes, int]] = [
            ("bad json", b'{"inputs": [', 400),
            (
                "wrong shape",
                json.dumps(
                    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
                ).encode(),
                400,
            ),
            (
                "sandbox",
                json.dumps(
                    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [1e6] * 64}]}
                ).encode(),
                400,
            ),
            (
                "sandbox nan",
                json.dumps(
                    {
                        "inputs": [
                            {"name": "input", "datatype": "FP32", "shape": [1, 64], "data": ["NaN"] * 64}
                        ]
                    }
                ).encode(),
                400,
            ),
        ]
        routed: list[tuple[str, bytes, int]] = [
            (
                "/v1/predict",
                '{"query": "天气", "timestamp": "now"}'.encode(),
                400,
            ),  # a field of the wrong type
            ("/v1/route", b'{"orders": []}', 400),  # no couriers
        ]
        while not self._stop.wait(0.05):
            pick = int(rng.integers(0, len(cases) + 2 + (len(routed) if self._pipelines else 0)))
            started = time.monotonic()
            if pick == len(cases):
                self._expect(name, started, f"/v2/models/{self.model}/infer", b"x" * 1_200_000, 413)
            elif pick == len(cases) + 1:
                self._expect(name, started, "/v2/models/no_such_model/infer", cases[1][1], 404)
            elif pick > len(cases) + 1:
                path, body, status = routed[pick - len(cases) - 2]
                self._expect(name, started, path, body, status)
            else:
                _, body, status = cases[pick]
                self._expect(name, started, f"/v2/models/{self.model}/infer", body, status)

    def _expect(self, name: str, started: float, path: str, body: bytes, status: int) -> None:
        request = urllib.request.Request(
            f"{self.server.http_url}{path}", body, {"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                got = reply.status
                text = reply.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            got, text = error.code, error.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            if status == 413:  # the server may close before reading an oversized body
                self._record(name, "expected_4xx", started)
            else:
                self._record(name, "lost", started, detail=repr(exc))
            return
        if got == status:
            self._record(name, "expected_4xx", started)
        else:
            self._record(name, "wrong", started, detail=f"{path}: expected {status}, got {got} {text[:120]}")

    def _reloader(self, name: str, seed: int) -> None:
        while not self._stop.wait(self.reload_s):
            for model in self.reload_models:
                started = time.monotonic()
                request = urllib.request.Request(
                    f"{self.server.http_url}/v2/repository/models/{model}/load", b"{}"
                )
                try:
                    with contextlib.closing(urllib.request.urlopen(request, timeout=120)):
                        pass
                except (OSError, http.client.HTTPException) as exc:
                    self._record(name, "lost", started, detail=f"reload {model}: {exc!r}")
                    continue
                self.reloads += 1
