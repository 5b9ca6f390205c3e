"""Token streaming over gRPC: ``ModelStreamInfer`` for LLM models, one response per engine step.

As a Triton decoupled model (its vLLM backend, ``generate_stream``) answers on the stream: each
step's new text is one ``ModelInferResponse`` with the ``text_output`` BYTES [1] output, and
every response carries the ``triton_final_response`` parameter, true on the last one (which also
carries ``finish_reason`` and the token counts). A request sends ``text_input`` (BYTES [1]), and
optionally ``stream`` (BOOL [1]; false: one response with the whole text) and
``sampling_parameters`` (BYTES [1], a JSON object: Triton vLLM's input); scalar sampling fields
may also come as request parameters (OpenAI's names). Anything else is refused by name, on the
stream, with the request's id: the stream stays open for the next requests.

Generation goes through the server's :class:`~ortserve.server.exchange.Exchange` as HTTP's
generate routes do (request id, routing between LLM versions, tenancy, metrics, access log,
span, capture). A client that leaves (the call is cancelled) cancels the sequence: the engine
drops it at its next step and its keys and values are freed.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Mapping

import numpy as np
import orjson

from ortserve.core.types import InferInput, InferRequest
from ortserve.errors import InvalidInput, OrtServeError
from ortserve.llm.sequence import GenerationEvent
from ortserve.llm.servable import GenerationStream, LlmVersion
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.grpc.codec import decode_infer_request
from ortserve.protocol.openai_sampling import sampling_params
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.deferred import attempt
from ortserve.server.exchange import Exchange
from ortserve.server.grpc.call import GrpcCall
from ortserve.telemetry import RequestScope

__all__ = ["FINAL_RESPONSE", "GenerationStreams"]

FINAL_RESPONSE = "triton_final_response"
"""The response parameter Triton sets on every response of a decoupled model: true on the last."""

SAMPLING_FIELDS = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "logit_bias",
        "cache_salt",
    }
)
"""Fields a generation request may set (request parameters or ``sampling_parameters``)."""

_TRANSPORT_PARAMETERS = frozenset({"triton_enable_empty_final_response", "stream"})
"""Request parameters about the stream itself: the final response always carries the final
flag (so an empty one is never needed), and ``stream`` is as the input of that name."""

_INPUTS = frozenset({"text_input", "stream", "sampling_parameters", "exclude_input_in_output"})
_OUTPUT = "text_output"


class GenerationStreams:
    """Answers LLM requests on a ``ModelStreamInfer`` call through the Exchange.

    Args:
        exchange: the server's one request edge (shared with HTTP).
        limits: tensor limits applied while decoding.
    """

    def __init__(self, exchange: Exchange, limits: TensorLimits) -> None:
        self._exchange = exchange
        self._limits = limits

    def serves(self, request: pb.ModelInferRequest) -> bool:
        """Whether the request's model generates text (an unknown model is not: the OIP path
        answers its error)."""
        served = attempt(self._exchange.dataplane.resolve, request.model_name, request.model_version or None)
        return isinstance(served, LlmVersion)

    async def answer(self, request: pb.ModelInferRequest, call: GrpcCall) -> None:
        """Generate for one request of the stream, writing a response per step (or one), or
        one error response. Cancelled when the client leaves: the sequence is cancelled."""
        exchange = self._exchange
        scope = exchange.begin(
            "grpc", request.model_name, request.model_version or None, None, _traceparent(exchange, call)
        )
        started = exchange.attempt(scope, self._start, scope, request, call)
        if isinstance(started, OrtServeError):
            call.write(_error_response(request, started.message))
            return
        llm, stream, streamed = started
        messages = _messages(request, llm, stream, streamed)
        async for message in exchange.stream(scope, messages, functools.partial(_error_of, request)):
            call.write(message)

    def _start(
        self, scope: RequestScope, request: pb.ModelInferRequest, call: GrpcCall
    ) -> tuple[LlmVersion, GenerationStream, bool]:
        """Admit the tenant, decode, route to an LLM version, queue the generation (the tenant
        is charged its tokens when the scope finishes).

        Raises:
            Unauthenticated, InvalidInput, ModelNotFound, ModelNotReady, Overloaded.
        """
        exchange = self._exchange
        tenant = None if exchange.gate is None else exchange.admit(call.metadata_value, generation=True)
        decoded = decode_infer_request(request, self._limits, exchange.dataplane.shared_memory)
        scope.identify(decoded)
        sample = scope.sample
        if sample is not None and not sample.body:  # captured in its HTTP form, as OIP infer
            sample.request = decoded
        text, fields, streamed = generation_fields(decoded)
        llm = exchange.llm(
            scope, request.model_name, request.model_version or None, call.metadata_value, fields, tenant
        )
        params = sampling_params(fields, llm.default_max_tokens, llm.tokenizer.vocab_size, chat=False)
        salt = llm.cache_salt(fields, call.metadata_value)
        stream = llm.generate(llm.tokenizer.encode(text), params, salt)
        exchange.started(scope, tenant, llm, (stream,))
        return llm, stream, streamed


def generation_fields(request: InferRequest) -> tuple[str, dict[str, object], bool]:
    """(prompt text, sampling fields, stream each step) of a decoded generation request.

    Raises:
        InvalidInput: a missing or malformed ``text_input``, an input, output or parameter
            this route does not honour (named), a bad ``sampling_parameters`` document.
    """
    inputs = {i.name: i for i in request.inputs}
    unknown = sorted(set(inputs) - _INPUTS)
    if unknown:
        raise InvalidInput(f"input {unknown[0]!r} is not taken by a generation model (inputs: text_input, "
                           "stream, sampling_parameters, exclude_input_in_output)")  # fmt: skip
    if request.outputs is not None and any(o.name != _OUTPUT for o in request.outputs):
        raise InvalidInput(f"a generation model has one output, {_OUTPUT}")
    if "text_input" not in inputs:
        raise InvalidInput("input 'text_input' (BYTES [1]) is required")
    text = _text(_one(inputs["text_input"], "BYTES"), "text_input")
    fields: dict[str, object] = {}
    if "sampling_parameters" in inputs:
        fields.update(_document(_text(_one(inputs["sampling_parameters"], "BYTES"), "sampling_parameters")))
    streamed = True
    for key, value in request.parameters.items():
        if key == "stream":
            streamed = _flag(value, "parameter 'stream'")
        elif key in SAMPLING_FIELDS:
            fields[key] = value
        elif key not in _TRANSPORT_PARAMETERS and key not in ("priority", "timeout"):
            raise InvalidInput(f"parameter {key!r} is not honoured by a generation model")
    if request.priority or request.timeout_s is not None:
        name = "priority" if request.priority else "timeout"
        raise InvalidInput(f"parameter {name!r} is not honoured by a generation model")
    if "stream" in inputs:
        streamed = _flag(_one(inputs["stream"], "BOOL"), "input 'stream'")
    if "exclude_input_in_output" in inputs and not _flag(
        _one(inputs["exclude_input_in_output"], "BOOL"), "input 'exclude_input_in_output'"
    ):
        raise InvalidInput("input 'exclude_input_in_output': the output never repeats the prompt; send true")
    return text, fields, streamed


def _one(tensor: InferInput, datatype: str) -> object:
    if tensor.datatype != datatype or tensor.data.size != 1:
        raise InvalidInput(f"input {tensor.name!r} must be {datatype} with one element")
    value: object = tensor.data.reshape(-1)[0]
    return value


def _text(value: object, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"input {name!r} is not UTF-8") from exc
    return str(value)


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise InvalidInput(f"{where} must be a boolean")
    return bool(value)


def _document(text: str) -> Mapping[str, object]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"input 'sampling_parameters' is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidInput("input 'sampling_parameters' must be a JSON object")
    unknown = sorted(set(value) - SAMPLING_FIELDS)
    if unknown:
        raise InvalidInput(f"sampling_parameters: field {unknown[0]!r} is not honoured by a generation model")
    return value


def _traceparent(exchange: Exchange, call: GrpcCall) -> str | None:
    if exchange.telemetry.tracing is None:
        return None
    return call.metadata_value("traceparent")


def _bytes_element(text: str) -> bytes:
    """One BYTES element in the binary form: its 4-byte little-endian length, then the bytes."""
    data = text.encode()
    return len(data).to_bytes(4, "little") + data


def _response(
    request: pb.ModelInferRequest,
    llm: LlmVersion,
    stream: GenerationStream,
    text: str,
    event: GenerationEvent,
) -> pb.ModelStreamInferResponse:
    answer = pb.ModelInferResponse(
        model_name=llm.info.name,
        model_version=llm.info.version,
        id=request.id,
        outputs=[pb.ModelInferResponse.InferOutputTensor(name=_OUTPUT, datatype="BYTES", shape=[1])],
        raw_output_contents=[_bytes_element(text)],
    )
    final = event.finish_reason is not None
    parameters = answer.parameters
    parameters[FINAL_RESPONSE].bool_param = final
    if final:
        parameters["finish_reason"].string_param = event.finish_reason or ""
        parameters["prompt_tokens"].int64_param = stream.prompt_tokens
        parameters["completion_tokens"].int64_param = stream.completion_tokens
        parameters["cached_tokens"].int64_param = stream.cached_tokens
    return pb.ModelStreamInferResponse(infer_response=answer)


async def _messages(
    request: pb.ModelInferRequest, llm: LlmVersion, stream: GenerationStream, streamed: bool
) -> AsyncIterator[pb.ModelStreamInferResponse]:
    """A response per step, or one with the whole text; a client that leaves cancels the
    sequence (``events()`` does, as it is closed)."""
    if streamed:
        async for event in stream.events():
            yield _response(request, llm, stream, event.text, event)
    else:
        whole = await stream.collect()
        yield _response(request, llm, stream, whole.text, whole)


def _error_of(request: pb.ModelInferRequest, error: OrtServeError) -> pb.ModelStreamInferResponse:
    return _error_response(request, error.message)


def _error_response(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    """A failed request's answer on the stream: its message, and its id so the client can match
    it; flagged final (nothing more comes for it)."""
    answer = pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    answer.parameters[FINAL_RESPONSE].bool_param = True
    return pb.ModelStreamInferResponse(error_message=message, infer_response=answer)
