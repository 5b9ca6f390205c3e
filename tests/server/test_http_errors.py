"""Every error path over HTTP gets its status code, and a good request succeeds right after."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient

from model_builders import ERROR_SERVER_MAX_BODY
from ortserve.testing import ServerProcess

pytestmark = pytest.mark.e2e


def post(
    server: ServerProcess, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    try:
        connection.request("POST", path, body, headers or {})
        reply = connection.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        connection.close()


def good_request(server: ServerProcess) -> None:
    """A request that must succeed: the server kept serving."""
    body = {"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32", "data": list(range(12))}]}
    status, _, raw = post(server, "/v2/models/failing/infer", json.dumps(body).encode())
    assert status == 200, raw
    assert json.loads(raw)["outputs"][0]["shape"] == [4, 3]


def failing_body(**tensor: object) -> bytes:
    base: dict[str, object] = {"name": "x", "shape": [3, 4], "datatype": "FP32", "data": list(range(12))}
    base.update(tensor)
    return json.dumps({"inputs": [base]}).encode()


BAD_REQUESTS = [
    ("/v2/models/failing/infer", b"{not json", "not valid JSON"),
    ("/v2/models/failing/infer", failing_body(name="nope"), "unexpected input 'nope'"),
    ("/v2/models/failing/infer", failing_body(datatype="INT32"), "datatype INT32"),
    ("/v2/models/failing/infer", failing_body(shape=[3, 5], data=list(range(15))), "dimension 1"),
    ("/v2/models/failing/infer", failing_body(shape=[12], data=list(range(12))), "rank 1"),
    ("/v2/models/failing/infer", failing_body(shape=[9, 4]), "has 12 elements"),
    (
        "/v2/models/failing/infer",
        failing_body(shape=[1_000_000_000, 64], data=[1.0] * 64),
        "exceeds the limit",
    ),
    ("/v2/models/failing/infer", failing_body(shape=[9, 4], data=list(range(36))), "max_batch_size 8"),
    ("/v2/models/failing/infer", json.dumps({"inputs": []}).encode(), "non-empty"),
    (
        "/v2/models/failing/infer",
        json.dumps(
            {
                "inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32", "data": list(range(12))}],
                "outputs": [{"name": "zzz"}],
            }
        ).encode(),
        "unknown output",
    ),
    (
        "/v2/models/typed/infer",
        json.dumps(
            {"inputs": [{"name": "i64", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3, 4, 5, 6]}]}
        ).encode(),
        "missing inputs",
    ),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD_REQUESTS)
def test_invalid_requests_are_400_and_named(
    error_repository_server: ServerProcess, path: str, body: bytes, message: str
) -> None:
    status, _, raw = post(error_repository_server, path, body)
    assert status == 400
    assert message in json.loads(raw)["error"]
    good_request(error_repository_server)


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/nope/infer",
        "/v2/models/failing/versions/7/infer",
        "/v2/models/failing/versions/x/infer",
        "/v2/models/failing/versions/%C2%B2/infer",  # "²": a digit to str.isdigit, not to int()
        "/v2/models/failing/versions/%D9%A3/infer",  # "٣": int() reads it as 3; not a version here
        "/v2/models/failing/versions/" + "9" * 5000 + "/infer",  # int() refuses it: it was a 500
        "/v2/nothing",
        "/v3",
    ],
)
def test_unknown_models_versions_and_routes_are_404(
    error_repository_server: ServerProcess, path: str
) -> None:
    status, _, raw = post(error_repository_server, path, failing_body())
    assert status == 404
    assert json.loads(raw)["error"]
    good_request(error_repository_server)


def test_a_binary_header_length_of_thousands_of_digits_is_a_400(
    error_repository_server: ServerProcess,
) -> None:
    """int() refuses strings over 4,300 digits: the header was a 500 with a traceback."""
    head = b"Inference-Header-Content-Length: " + b"9" * 5000 + b"\r\n"
    raw = request_raw(
        error_repository_server,
        b"POST /v2/models/failing/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n" + head + b"\r\n{}",
    )
    assert raw.startswith(b"HTTP/1.1 400") and b"Inference-Header-Content-Length" in raw
    good_request(error_repository_server)


def test_a_transfer_coding_other_than_chunked_is_501(error_repository_server: ServerProcess) -> None:
    """RFC 9112 6.1: "gzip, chunked" was read as chunked and the gzip silently ignored."""
    raw = request_raw(
        error_repository_server,
        b"POST /v2/models/failing/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n",
    )
    assert raw.startswith(b"HTTP/1.1 501") and b"chunked" in raw
    good_request(error_repository_server)


def test_expect_100_continue_without_a_body_gets_no_interim_answer(
    error_repository_server: ServerProcess,
) -> None:
    raw = request_raw(
        error_repository_server, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n"
    )
    assert raw.startswith(b"HTTP/1.1 200") and b"100 Continue" not in raw


def test_wrong_method_is_405(error_repository_server: ServerProcess) -> None:
    status, _, _ = post(error_repository_server, "/v2/health/ready", b"")
    assert status == 405
    good_request(error_repository_server)


def test_body_over_the_limit_is_413(error_repository_server: ServerProcess) -> None:
    status, _, raw = post(
        error_repository_server, "/v2/models/failing/infer", b" " * (ERROR_SERVER_MAX_BODY + 1)
    )
    assert status == 413
    assert "size limit" in json.loads(raw)["error"]
    good_request(error_repository_server)


def test_model_that_failed_to_load_is_503_naming_it_with_its_reason_only_in_the_log(
    error_repository_server: ServerProcess,
) -> None:
    status, _, raw = post(error_repository_server, "/v2/models/broken/infer", failing_body())
    assert (status, json.loads(raw)["error"]) == (503, "model 'broken' is failed (the server log says why)")
    status, _, raw = post(error_repository_server, "/v2/models/bad_config/infer", failing_body())
    assert (status, json.loads(raw)["error"]) == (
        503,
        "model 'bad_config' is failed (the server log says why)",
    )
    assert "batching.max_batch_size" in error_repository_server.log()
    good_request(error_repository_server)


def request_raw(server: ServerProcess, head: bytes) -> bytes:
    """Send one request as bytes; the whole answer (the server closes or answers one)."""
    with socket.create_connection((server.host, server.http_port), timeout=10) as sock:
        sock.sendall(head)
        sock.settimeout(2)
        reply = b""
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                reply += chunk
    return reply


def test_connect_is_a_clean_400_not_a_parser_callback_error(error_repository_server: ServerProcess) -> None:
    reply = request_raw(error_repository_server, b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400")
    assert reply.endswith(b'{"error":"the request target must be a path (this server is no proxy)"}')
    good_request(error_repository_server)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/v2/health/ready", "GET, HEAD, OPTIONS"),
        ("DELETE", "/v2/models/failing", "GET, HEAD, OPTIONS"),
        ("GET", "/v2/models/failing/infer", "POST, OPTIONS"),
        ("TRACE", "/v2", "GET, HEAD, OPTIONS"),
        ("POST", "/metrics", "GET, HEAD, OPTIONS"),
    ],
)
def test_405_names_the_allowed_methods_and_options_answers_them(
    error_repository_server: ServerProcess, method: str, path: str, allow: str
) -> None:
    connection = http.client.HTTPConnection(
        error_repository_server.host, error_repository_server.http_port, timeout=30
    )
    try:
        connection.request(method, path)
        reply = connection.getresponse()
        assert (reply.status, reply.getheader("allow")) == (405, allow)
        reply.read()
        connection.request("OPTIONS", path)
        reply = connection.getresponse()
        assert (reply.status, reply.getheader("allow"), reply.read()) == (204, allow, b"")
        assert reply.getheader("content-length") is None
    finally:
        connection.close()


def test_head_is_get_without_the_body(error_repository_server: ServerProcess) -> None:
    connection = http.client.HTTPConnection(
        error_repository_server.host, error_repository_server.http_port, timeout=30
    )
    try:
        for path in ("/v2/models/failing", "/metrics", "/v2/health/live", "/v2/health/live"):
            connection.request("GET", path)
            got = connection.getresponse()
            body = got.read()
            connection.request("HEAD", path)  # the same connection: the HEAD answer must end at its head
            head = connection.getresponse()
            assert (head.status, head.read()) == (200, b"")
            assert head.getheader("content-type") == got.getheader("content-type")
            if path != "/metrics":  # metrics move between the two calls
                assert int(head.getheader("content-length") or -1) == len(body)
        connection.request("OPTIONS", "/nowhere")
        assert connection.getresponse().status == 404
    finally:
        connection.close()


def test_strict_readiness_off_still_reports_failed_models_not_ready(
    error_repository_server: ServerProcess,
) -> None:
    with contextlib.closing(httpclient.InferenceServerClient(error_repository_server.http_address)) as client:
        assert client.is_server_ready()
        assert not client.is_model_ready("broken")
        assert client.is_model_ready("failing")


def test_runtime_failure_is_500_without_internals(error_repository_server: ServerProcess) -> None:
    body = failing_body(shape=[1, 4], data=[1, 2, 3, 4])
    status, _, raw = post(error_repository_server, "/v2/models/failing/infer", body)
    assert status == 500
    message = json.loads(raw)["error"]
    assert "Traceback" not in message and "onnxruntime" not in message.lower()
    good_request(error_repository_server)


def slow_body(timeout_us: int | None = None) -> tuple[bytes, dict[str, str]]:
    header: dict[str, object] = {
        "inputs": [
            {
                "name": "x",
                "shape": [1, 256, 256],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 256 * 256 * 4},
            }
        ]
    }
    if timeout_us is not None:
        header["parameters"] = {"timeout": timeout_us}
    raw_header = json.dumps(header).encode()
    data = np.full((1, 256, 256), 0.001, dtype=np.float32).tobytes()
    return raw_header + data, {"Inference-Header-Content-Length": str(len(raw_header))}


def test_overload_is_429_with_retry_after(error_repository_server: ServerProcess) -> None:
    body, headers = slow_body()
    with ThreadPoolExecutor(12) as pool:
        replies = list(
            pool.map(
                lambda _: post(error_repository_server, "/v2/models/slow/infer", body, headers), range(12)
            )
        )
    statuses = [status for status, _, _ in replies]
    assert 429 in statuses and 200 in statuses
    refused = next(r for r in replies if r[0] == 429)
    assert int(refused[1]["retry-after"]) >= 1
    good_request(error_repository_server)


def _fill_slow_queue(server: ServerProcess, pool: ThreadPoolExecutor) -> list[object]:
    body, headers = slow_body()
    return [pool.submit(post, server, "/v2/models/slow/infer", body, headers) for _ in range(6)]


def test_an_overloaded_model_refuses_from_the_headers_without_reading_the_body(
    error_repository_server: ServerProcess,
) -> None:
    # While the slow model's queue is full, a request whose body is not even valid gets 429
    # (its body was never decoded, or it would be 400), and the connection stays usable.
    garbage = b"\xff" * 5000
    request = (
        b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nX-Request-ID: early-1\r\n"
        b"Content-Length: %d\r\n\r\n" % len(garbage)
    ) + garbage
    statuses = []
    for _ in range(5):  # the queue must still be full when the request lands
        with ThreadPoolExecutor(6) as pool:
            filling = _fill_slow_queue(error_repository_server, pool)
            with socket.create_connection(
                (error_repository_server.host, error_repository_server.http_port), timeout=30
            ) as sock:
                sock.sendall(request + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                reply = sock.recv(65536)
                while reply.count(b"HTTP/1.1 ") < 2:
                    chunk = sock.recv(65536)
                    assert chunk, "connection closed early"
                    reply += chunk
            for future in filling:
                future.result()  # type: ignore[attr-defined]
        statuses.append(reply[9:12])
        if reply.startswith(b"HTTP/1.1 429"):
            break
    assert statuses[-1] == b"429", statuses
    head = reply.split(b"\r\n\r\n", 1)[0].lower()
    assert b"retry-after: " in head and b"x-request-id: early-1" in head
    assert b"HTTP/1.1 200" in reply  # the next request on the same connection was served


def test_deadline_passing_in_queue_is_504(error_repository_server: ServerProcess) -> None:
    slow, headers = slow_body()
    hurried, hurried_headers = slow_body(timeout_us=2000)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, error_repository_server, "/v2/models/slow/infer", slow, headers)
        second = pool.submit(post, error_repository_server, "/v2/models/slow/infer", hurried, hurried_headers)
        statuses = {first.result()[0], second.result()[0]}
    assert 504 in statuses or 429 in statuses  # refused at admission when the cost model knows better
    good_request(error_repository_server)


def test_malformed_http_gets_400_and_the_server_keeps_serving(error_repository_server: ServerProcess) -> None:
    with socket.create_connection(
        (error_repository_server.host, error_repository_server.http_port), timeout=10
    ) as sock:
        sock.sendall(b"GARBAGE \x00\x01 HTTP/9.9\r\n\r\n")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400")
    good_request(error_repository_server)


def test_truncated_body_then_disconnect_does_not_hurt(error_repository_server: ServerProcess) -> None:
    with socket.create_connection(
        (error_repository_server.host, error_repository_server.http_port), timeout=10
    ) as sock:
        sock.sendall(b'POST /v2/models/failing/infer HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{"inputs":')
    good_request(error_repository_server)


def test_typed_inputs_round_trip_in_json_and_binary(error_repository_server: ServerProcess) -> None:
    with contextlib.closing(httpclient.InferenceServerClient(error_repository_server.http_address)) as client:
        values = {
            "i64": np.array([[1, -2, 3], [2**40, 5, 6]], dtype=np.int64),
            "flag": np.array([True, False]),
            "half": np.array([0.5, -1.0, 65504.0, 0.0], dtype=np.float16),
            "text": np.array(["héllo".encode(), b"world"], dtype=np.object_),
        }
        datatypes = {"i64": "INT64", "flag": "BOOL", "half": "FP16", "text": "BYTES"}
        for binary in (False, True):
            inputs = []
            for name, array in values.items():
                tensor = httpclient.InferInput(name, list(array.shape), datatypes[name])
                tensor.set_data_from_numpy(array, binary_data=binary)
                inputs.append(tensor)
            outputs = [httpclient.InferRequestedOutput(f"{n}_out", binary_data=binary) for n in values]
            result = client.infer("typed", inputs, outputs=outputs)
            for name, array in values.items():
                got = result.as_numpy(f"{name}_out")
                if name == "text":
                    assert [bytes(x) if isinstance(x, bytes) else str(x).encode() for x in got] == list(array)
                else:
                    np.testing.assert_array_equal(got, array)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_compressed_requests_and_answers(
    error_repository_server: ServerProcess, algorithm: str, binary: bool
) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = httpclient.InferInput("x", [3, 4], "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    wanted = [httpclient.InferRequestedOutput("y", binary_data=binary)]
    with contextlib.closing(httpclient.InferenceServerClient(error_repository_server.http_address)) as client:
        plain = client.infer("failing", [tensor], outputs=wanted).as_numpy("y")
        compressed = client.infer(
            "failing",
            [tensor],
            outputs=wanted,
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
    assert compressed.as_numpy("y").tolist() == plain.tolist()


def typed_body(text: str) -> bytes:
    """An infer request for ``typed`` whose BYTES input (echoed back) holds ``text``."""
    inputs = [
        {"name": "i64", "shape": [2, 3], "datatype": "INT64", "data": list(range(6))},
        {"name": "flag", "shape": [2], "datatype": "BOOL", "data": [True, False]},
        {"name": "half", "shape": [4], "datatype": "FP16", "data": [0.5, 1.0, 1.5, 2.0]},
        {"name": "text", "shape": [2], "datatype": "BYTES", "data": [text, "b"]},
    ]
    return json.dumps({"inputs": inputs}).encode()


def test_infer_answers_are_compressed_as_accept_encoding_asks(error_repository_server: ServerProcess) -> None:
    body = gzip.compress(typed_body("a" * 4000))
    headers = {"Content-Encoding": "gzip", "Accept-Encoding": "deflate;q=0.5, gzip"}
    status, reply_headers, raw = post(error_repository_server, "/v2/models/typed/infer", body, headers)
    assert (status, reply_headers["content-encoding"]) == (200, "gzip")
    assert len(raw) < 1000
    answer = json.loads(gzip.decompress(raw))
    assert [o["data"] for o in answer["outputs"] if o["name"] == "text_out"] == [["a" * 4000, "b"]]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v2/health/live", None),
        ("GET", "/v2/models/typed", None),
        ("GET", "/v2/models/stats", None),
        ("POST", "/v2/models/failing/infer", failing_body()),  # a small answer
        ("POST", "/v2/models/typed/infer", b"{not json"),  # an error
        ("POST", "/v2/models/nope/infer", typed_body("a" * 4000)),  # an error
    ],
)
def test_other_answers_small_answers_and_errors_are_never_compressed(
    error_repository_server: ServerProcess, method: str, path: str, body: bytes | None
) -> None:
    """As Triton: tritonclient's aio client reads these without undoing a coding (issue 31)."""
    connection = http.client.HTTPConnection(
        error_repository_server.host, error_repository_server.http_port, timeout=30
    )
    try:
        connection.request(method, path, body, {"Accept-Encoding": "gzip, deflate, br"})
        reply = connection.getresponse()
        raw = reply.read()
    finally:
        connection.close()
    assert reply.getheader("content-encoding") is None
    json.loads(raw)


def test_a_compression_bomb_is_413_at_the_body_limit(error_repository_server: ServerProcess) -> None:
    bomb = gzip.compress(bytes(64 * ERROR_SERVER_MAX_BODY), compresslevel=1)  # 128 MB inflated
    assert len(bomb) < ERROR_SERVER_MAX_BODY
    status, _, raw = post(
        error_repository_server, "/v2/models/failing/infer", bomb, {"Content-Encoding": "gzip"}
    )
    assert status == 413
    assert "inflates past the size limit" in json.loads(raw)["error"]
    good_request(error_repository_server)


def test_an_unknown_content_encoding_is_415_with_the_codings_accepted(
    error_repository_server: ServerProcess,
) -> None:
    body = failing_body(shape=[3, 4], data=list(range(12)))
    status, reply_headers, raw = post(
        error_repository_server, "/v2/models/failing/infer", body, {"Content-Encoding": "br"}
    )
    assert status == 415
    assert reply_headers["accept-encoding"] == "gzip, deflate, identity"
    assert "'br' is not supported" in json.loads(raw)["error"]
    good_request(error_repository_server)


def get_json(server: ServerProcess, path: str) -> tuple[int, object]:
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("path", "status", "body"),
    [
        ("/v2/health/live", 200, {"live": True}),
        ("/v2/health/ready", 200, {"ready": True}),  # --no-strict-readiness: loading ended
        ("/v2/models/failing/ready", 200, {"name": "failing", "ready": True}),
        ("/v2/models/failing/versions/1/ready", 200, {"name": "failing", "ready": True}),
        ("/v2/models/broken/ready", 503, {"name": "broken", "ready": False}),
    ],
)
def test_health_bodies_are_kserves_v2_objects(
    error_repository_server: ServerProcess, path: str, status: int, body: object
) -> None:
    # KServe's InferenceRESTClient reads response.json().get("live") / .get("ready")
    # (test_kserve_client_e2e.py runs that client itself).
    assert get_json(error_repository_server, path) == (status, body)
