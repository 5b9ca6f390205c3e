"""``ortserve quantize``: FP16 / INT8 candidate versions of a repository model, and a table of
their size, latency and divergence from the source."""

from __future__ import annotations

import json
from pathlib import Path

import click

__all__ = ["quantize"]

_METHODS = ("fp16", "dynamic-int8", "static-int8")


@click.command()
@click.option(
    "--model-repository",
    "repository",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The model repository.",
)
@click.option("--model", required=True, help="The model folder's name.")
@click.option(
    "--from-version", "source", type=int, default=None, help="Version to start from (default: highest)."
)
@click.option(
    "--method",
    "methods",
    multiple=True,
    type=click.Choice(_METHODS),
    help="Repeatable: one new version per method, numbered after the highest version.",
)
@click.option(
    "--calibration",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Real inputs: a capture directory (--capture-dir of the server) or an .npz keyed by input "
    "name. Needed for static-int8; without it, random inputs (float models only).",
)
@click.option(
    "--samples", type=click.IntRange(1, 100_000), default=256, help="Most calibration requests used."
)
@click.option(
    "--threads", type=click.IntRange(1, 256), default=1, help="Intra-op threads for the latency figures."
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON instead of a table.")
@click.option(
    "--llm",
    "llm_bits",
    type=click.Choice(["int4", "int8"]),
    default=None,
    help="An LLM version: weight-only MatMulNBits (blockwise) instead of --method.",
)
@click.option(
    "--block-size", type=click.Choice(["32", "128"]), default="32", help="Weights per block (--llm)."
)
@click.option(
    "--trt-int8-calibration",
    "trt_int8",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Real inputs (capture directory or .npz): write TensorRT's INT8 calibration table beside "
    "the version's model instead of new versions; TensorRT sessions of it then run INT8.",
)
def quantize(
    repository: Path,
    model: str,
    source: int | None,
    methods: tuple[str, ...],
    calibration: Path | None,
    samples: int,
    threads: int,
    as_json: bool,
    llm_bits: str | None,
    block_size: str,
    trt_int8: Path | None,
) -> None:
    """Write quantized versions of MODEL and compare them with the source version.

    Each new version folder holds the converted model.onnx, a copy of the source's other files
    (a pipeline's artefacts), and quantization.json with its figures. Load it as a shadow, watch
    its divergence, then roll it out (docs/traffic.md).
    """
    from ortserve.errors import OrtServeError

    if trt_int8 is not None:
        from ortserve.quantization.tensorrt_int8 import write_version_calibration

        try:
            table = write_version_calibration(repository, model, source, trt_int8, samples)
        except OrtServeError as exc:
            raise click.ClickException(exc.message) from None
        click.echo(f"TensorRT INT8 calibration table: {table}")
        return
    if llm_bits is not None:
        from ortserve.llm.quantize import quantize_llm_version

        try:
            version, count = quantize_llm_version(
                repository, model, source, int(llm_bits[3:]), int(block_size)
            )
        except OrtServeError as exc:
            raise click.ClickException(exc.message) from None
        click.echo(
            f"{model} version {version}: {count} MatMuls as {llm_bits} MatMulNBits, block {block_size}"
        )
        return
    if not methods:
        raise click.UsageError("give --method (or --llm for an LLM version)")
    from ortserve.quantization.convert import Method
    from ortserve.quantization.quantizer import QuantizeJob
    from ortserve.quantization.quantizer import quantize as run
    from ortserve.quantization.report import format_table

    job = QuantizeJob(
        repository, model, tuple(Method(m) for m in methods), source, calibration, samples, threads
    )
    try:
        rows = run(job)
    except OrtServeError as exc:
        raise click.ClickException(exc.message) from None
    if as_json:
        click.echo(json.dumps([row.as_dict() for row in rows], indent=2))
    else:
        click.echo(format_table(rows))
