"""What ``ortserve bench`` sends: the requests of a run, built once before it starts (generated
from the model's metadata, read from an input file, or JSON bodies for an application route),
so that sending them costs the load generator nothing but the write."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import click

from ortserve.loadtest.inputs import Encoding
from ortserve.loadtest.transports import Target

__all__ = ["RequestSpec", "grpc_requests", "http_requests", "json_object", "route_checked"]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    model: str
    version: str | None
    batch_size: int
    seed: int
    shapes: dict[str, tuple[int, ...]]
    input_file: Path | None
    route: str | None = None
    """An application route the bodies go to instead of the model's infer path."""


def http_requests(url: str, encoding: Encoding, spec: RequestSpec) -> tuple[Target, list[bytes]]:
    """The HTTP target and the complete request bytes to send in turn."""
    from ortserve.loadtest.inputs import fetch_input_specs, generated_payloads, infer_path, payloads_from_file
    from ortserve.loadtest.transports import HttpTarget

    target = HttpTarget.parse(url)
    path = spec.route or infer_path(spec.model, spec.version)
    if spec.input_file is not None:
        payloads = payloads_from_file(spec.input_file, path, encoding, spec.batch_size)
    else:
        specs = fetch_input_specs(target, spec.model, spec.version)
        payloads = generated_payloads(
            specs, path, encoding, spec.batch_size, seed=spec.seed, shapes=spec.shapes
        )
    return target, [target.wire(p) for p in payloads]


def route_checked(route: str, transport: str, body_file: Path | None) -> str:
    """The route, once it is a path with JSON bodies to send to it; it names the run."""
    if not route.startswith("/") or any(c in route for c in " \r\n?#"):
        raise click.ClickException(f"--route must be a path such as /v1/predict, not {route!r}")
    if transport != "http-json" or body_file is None or body_file.suffix != ".jsonl":
        raise click.ClickException(
            "--route sends JSON bodies: it takes --body-file FILE.jsonl over http-json"
        )
    for number, line in enumerate(body_file.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip() and not isinstance(json_object(line), dict):
            raise click.ClickException(f"{body_file}:{number}: a body must be a JSON object")
    return route


def json_object(line: str) -> object:
    try:
        return json.loads(line)
    except ValueError:
        return None


def grpc_requests(url: str, spec: RequestSpec) -> tuple[Target, list[bytes]]:
    """The gRPC target and serialized ModelInferRequest messages to send in turn."""
    from ortserve.loadtest.grpc_transport import GrpcTarget, encode_request, fetch_grpc_input_specs
    from ortserve.loadtest.inputs import generated_inputs, npz_inputs

    target = GrpcTarget.parse(url)
    if spec.input_file is not None:
        if spec.input_file.suffix != ".npz":
            raise ValueError("--transport grpc reads inputs from .npz files only")
        inputs = npz_inputs(spec.input_file, spec.batch_size)
    else:
        specs = fetch_grpc_input_specs(target, spec.model, spec.version)
        inputs = generated_inputs(specs, spec.batch_size, seed=spec.seed, shapes=spec.shapes)
    return target, [encode_request(arrays, spec.model, spec.version) for arrays in inputs]
