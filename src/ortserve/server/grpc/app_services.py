"""The seed applications as typed gRPC services (``ortserve.apps.v1``, protocol/grpc/apps.proto).

``HotwordService/Predict`` and ``DispatchService/Route`` take and give messages that mirror the
JSON of ``POST /v1/predict`` and ``POST /v1/route`` field for field, and run the same pipelines
through the same Exchange (metrics, access log, trace, capture, routing by ``user_id`` or the
``x-user-id`` metadata): a message becomes the JSON body the route would get, and the route's
JSON answer becomes the reply. So the typed and JSON answers cannot drift apart.

A call serves the seed application's model (``hotword.pipeline``, ``dispatch.pipeline``), or
the pipeline the ``x-ortserve-model`` metadata names (a repository that serves the same
pipeline under another model name).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from ortserve.errors import InvalidInput
from ortserve.pipeline.runtime import pipeline_model_name
from ortserve.protocol.grpc import apps_pb2 as apb
from ortserve.server.exchange import Exchange
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.rpc import Rpc

__all__ = ["APP_SERVICES", "MODEL_METADATA", "AppServices", "message_document"]

APP_SERVICES = ("ortserve.apps.v1.HotwordService", "ortserve.apps.v1.DispatchService")
MODEL_METADATA = "x-ortserve-model"
"""Metadata naming the pipeline model a call goes to, when not the seed application's own."""
_MAX_MODEL_NAME = 256


def message_document(message: Message) -> dict[str, object]:
    """The JSON document a message mirrors: only the fields it sets (proto3 defaults left to the
    pipeline's own), integers kept integers (protobuf's JSON mapping writes int64 as strings),
    and a ``Point`` as the JSON's ``[lat, lon]`` pair."""
    document: dict[str, object] = {}
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.label == FieldDescriptor.LABEL_REPEATED:
                document[field.name] = [_json_value(item) for item in value]
            else:
                document[field.name] = _json_value(value)
        elif field.label == FieldDescriptor.LABEL_REPEATED:
            document[field.name] = list(value)
        else:
            document[field.name] = value
    return document


def _json_value(message: Message) -> object:
    if isinstance(message, apb.Point):
        return [message.lat, message.lon]
    return message_document(message)


class AppServices:
    """The typed services' routes, each a pipeline call through the server's Exchange.

    Args:
        exchange: the server's one request edge.
    """

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange

    def routes(self) -> dict[str, Rpc]:
        """Every method, by its HTTP/2 path."""
        return {
            f"/{APP_SERVICES[0]}/Predict": Rpc(
                apb.PredictRequest, unary=self._method("/v1/predict", "hotword", apb.PredictResponse)
            ),
            f"/{APP_SERVICES[1]}/Route": Rpc(
                apb.RouteRequest, unary=self._method("/v1/route", "dispatch", apb.RouteResponse)
            ),
        }

    def _method(
        self, route: str, seed: str, answer_type: type[Message]
    ) -> Callable[[Message, GrpcCall], Coroutine[Any, Any, Message]]:
        async def handle(request: Message, call: GrpcCall) -> Message:
            return await self._call(route, seed, answer_type, request, call)

        return handle

    async def _call(
        self, route: str, seed: str, answer_type: type[Message], request: Message, call: GrpcCall
    ) -> Message:
        exchange = self._exchange
        name = call.metadata_value(MODEL_METADATA) or pipeline_model_name(seed)
        body = orjson.dumps(message_document(request))
        request_id = call.metadata_value("x-request-id")
        scope = exchange.begin(
            "grpc", name[:_MAX_MODEL_NAME], None, request_id, call.metadata_value("traceparent"), route,
            call.metadata_value, body,
        )  # fmt: skip
        call.scope_failed = functools.partial(exchange.failed, scope)  # what raises, finished
        if exchange.gate is not None:  # the tenant's key and quota, before decoding
            exchange.admit(call.metadata_value)
        if len(name) > _MAX_MODEL_NAME:
            raise InvalidInput(f"metadata {MODEL_METADATA} is longer than {_MAX_MODEL_NAME} characters")
        try:
            served, answer = await exchange.pipeline(scope, name, call.metadata_value, body)
        except asyncio.CancelledError:
            exchange.abandon(scope)
            raise
        reply = json_format.Parse(answer, answer_type(), ignore_unknown_fields=True)
        call.scope_failed = None
        call.trailing = (("x-model-version", served),)
        exchange.finish(scope, None, "OK")
        return reply
