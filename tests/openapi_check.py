"""Checking real HTTP exchanges against ortserve's OpenAPI document, and recording them.

``OpenApiSpec`` finds the operation of a request, then validates its JSON body (the JSON header
of a binary-tensor body) and the answer's status and JSON body with jsonschema (2020-12, as
OpenAPI 3.1 uses it). ``TeeProxy`` sits between a client and the server and keeps the bytes
each way, which ``exchanges`` splits into requests and answers (Content-Length framing).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

_URI = "urn:ortserve-openapi"
_HEADER_LENGTH = "inference-header-content-length"


@dataclass
class Message:
    """One request or answer: its first line, headers (names lower-case) and body."""

    start: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Exchange:
    request: Message
    response: Message

    @property
    def method(self) -> str:
        return self.request.start.split()[0]

    @property
    def path(self) -> str:
        return self.request.start.split()[1].split("?")[0]

    @property
    def status(self) -> int:
        return int(self.response.start.split()[1])


def _json_part(message: Message) -> Any:
    """The JSON document of a body (the header part of a binary-tensor body), or None."""
    body = message.body
    length = message.headers.get(_HEADER_LENGTH)
    if length is not None:
        body = body[: int(length)]
    return json.loads(body) if body else None


class OpenApiSpec:
    """Operations and schemas of one OpenAPI 3.1 document."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        resource = Resource.from_contents(document, default_specification=DRAFT202012)
        self._registry: Registry[Any] = Registry().with_resource(_URI, resource)

    def resolve(self, item: dict[str, Any]) -> dict[str, Any]:
        """An OpenAPI object with its top-level ``$ref`` (to ``#/components/...``) followed."""
        while "$ref" in item:
            target: Any = self.document
            for part in item["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            item = target
        return item

    def describes(self, path: str) -> bool:
        """Some described path template matches ``path``."""
        return any(self._match(path, method) for method in ("get", "post", "put", "delete"))

    def _match(self, path: str, method: str) -> str | None:
        try:
            return self.operation(method, path)[0]
        except AssertionError:
            return None

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any]]:
        """(template, operation) serving ``method path``; literal segments beat parameters."""
        segments = path.strip("/").split("/")
        best: tuple[int, str] | None = None
        for template, item in self.document["paths"].items():
            parts = template.strip("/").split("/")
            if method.lower() not in item or len(parts) != len(segments):
                continue
            literal = 0
            for part, segment in zip(parts, segments):
                if part.startswith("{"):
                    if not segment:
                        break
                elif part == segment:
                    literal += 1
                else:
                    break
            else:
                if best is None or literal > best[0]:
                    best = (literal, template)
        assert best is not None, f"{method} {path} is not described"
        return best[1], self.document["paths"][best[1]][method.lower()]

    def _validate(self, pointer: str, instance: Any) -> None:
        validator = jsonschema.Draft202012Validator({"$ref": f"{_URI}#{pointer}"}, registry=self._registry)
        validator.validate(instance)

    def check(self, exchange: Exchange) -> None:
        """Raises AssertionError or jsonschema.ValidationError naming what does not fit."""
        template, operation = self.operation(exchange.method, exchange.path)
        where = f"/paths/{_escape(template)}/{exchange.method.lower()}"
        request_document = _json_part(exchange.request)
        if "requestBody" in operation and request_document is not None:
            body = self.resolve(operation["requestBody"])
            schema = body["content"]["application/json"]["schema"]
            self._validate(_pointer_to(self, where + "/requestBody", schema), request_document)
        responses = operation["responses"]
        key = str(exchange.status) if str(exchange.status) in responses else "default"
        assert key in responses, f"{exchange.method} {exchange.path}: status {exchange.status} not described"
        response = self.resolve(responses[key])
        answer = _json_part(exchange.response) if _is_json(exchange.response) else None
        content = response.get("content")
        if content is None:
            assert not exchange.response.body, f"{exchange.path}: {exchange.status} should have no body"
            return
        if "application/json" in content and not exchange.response.body:
            raise AssertionError(f"{exchange.method} {exchange.path}: {exchange.status} has no JSON body")
        if answer is not None and "application/json" in content:
            schema_pointer = _pointer_to(
                self, f"{where}/responses/{key}", content["application/json"]["schema"]
            )
            self._validate(schema_pointer, answer)


def _is_json(message: Message) -> bool:
    return message.headers.get("content-type", "").startswith(("application/json", "application/octet"))


def _escape(template: str) -> str:
    return template.replace("~", "~0").replace("/", "~1")


def _pointer_to(spec: OpenApiSpec, where: str, schema: dict[str, Any]) -> str:
    """A JSON pointer to ``schema``: its own ``$ref`` when it is one, else found under ``where``."""
    if set(schema) == {"$ref"}:
        return str(schema["$ref"]).removeprefix("#")
    return _find(spec.document, schema) or where


def _find(node: Any, wanted: Any, pointer: str = "") -> str | None:
    if node is wanted:
        return pointer
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        found = _find(child, wanted, f"{pointer}/{_escape(str(key))}")
        if found is not None:
            return found
    return None


def _messages(stream: bytes) -> list[Message]:
    """Split one direction of an HTTP/1.1 connection into messages (Content-Length framing)."""
    messages = []
    while stream:
        head, stream = stream.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        messages.append(Message(lines[0], headers, stream[:length]))
        stream = stream[length:]
    return messages


@dataclass
class _Connection:
    sent: bytearray = field(default_factory=bytearray)
    received: bytearray = field(default_factory=bytearray)


class TeeProxy:
    """A TCP proxy on 127.0.0.1 that forwards to ``upstream`` and keeps every byte both ways."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._connections: list[_Connection] = []
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            record = _Connection()
            self._connections.append(record)
            self._start(_pump, client, server, record.sent)
            self._start(_pump, server, client, record.received)

    def exchanges(self) -> list[Exchange]:
        """Every request with its answer, connection by connection, in order."""
        paired = []
        for record in self._connections:
            requests, responses = _messages(bytes(record.sent)), _messages(bytes(record.received))
            assert len(requests) == len(responses), "a request went unanswered"
            paired += [Exchange(q, a) for q, a in zip(requests, responses)]
        return paired

    def close(self) -> None:
        """Stop accepting and wait until every connection has ended (the client closed first)."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress
        self._listener.close()
        for thread in self._threads:
            thread.join(10.0)


def _pump(source: socket.socket, sink: socket.socket, record: bytearray) -> None:
    """Copy one direction until it ends, then end both (the other pump closes its own source)."""
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            record += chunk
            sink.sendall(chunk)
    for each in (source, sink):
        with contextlib.suppress(OSError):
            each.shutdown(socket.SHUT_RDWR)
    source.close()
