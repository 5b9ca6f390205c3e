"""The ``ortserve bench`` and ``ortserve replay`` commands: load, measure, report, judge SLOs."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import click

from ortserve.cli.bench_requests import RequestSpec, grpc_requests, http_requests, route_checked
from ortserve.loadtest.generator import LoadLevel
from ortserve.loadtest.measurement import Measurement
from ortserve.loadtest.plot import plot, plot_available
from ortserve.loadtest.report import LevelResult, render_table, render_verdicts, result_document
from ortserve.loadtest.slo import Objective, judge, parse_objective

__all__ = ["INTERRUPTED", "SLO_VIOLATED", "bench", "replay"]

SLO_VIOLATED = 3
"""Exit code when a ``--slo`` objective was not met."""
INTERRUPTED = 130
"""Exit code after Ctrl-C (what was measured so far is still reported)."""


def _positive_numbers(text: str | None, kind: type[float]) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise click.BadParameter("expected positive numbers")
    return values


def _concurrencies(ctx: click.Context, param: click.Parameter, text: str | None) -> list[int] | None:
    values = _positive_numbers(text, float)
    if values is not None and any(v != int(v) for v in values):
        raise click.BadParameter("expected whole numbers")
    return None if values is None else [int(v) for v in values]


def _rates(ctx: click.Context, param: click.Parameter, text: str | None) -> list[float] | None:
    return _positive_numbers(text, float)


def _progress_stream(progress: bool | None) -> TextIO | None:
    """stderr when asked, or by default when it is a terminal."""
    stream = sys.stderr
    if progress is None:
        return stream if stream.isatty() else None
    return stream if progress else None


def _objectives(texts: tuple[str, ...]) -> list[Objective]:
    try:
        return [parse_objective(text) for text in texts]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--slo") from None


def _shapes(texts: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for text in texts:
        name, _, dims = text.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise click.BadParameter(f"expected NAME=D1,D2,..., got {text!r}", param_hint="--shape") from None
    return shapes


def _finish(
    command: str,
    settings: dict[str, object],
    results: list[LevelResult],
    objectives: list[Objective],
    output: Path | None,
    plot_path: Path | None,
    x_label: str,
    interrupted: bool,
    judged: int | None = None,
) -> None:
    """Print the table and verdicts, write JSON and plot, exit with the verdict's code.

    Objectives are judged at every level, or at the first ``judged`` ones.
    """
    click.echo(render_table(results))
    verdicts = judge(objectives, [(r.label, r.measurement) for r in results[:judged]])
    if verdicts:
        click.echo(render_verdicts(verdicts))
    if output is not None:
        output.write_bytes(result_document(command, settings, results, verdicts))
        click.echo(f"wrote {output}")
    if plot_path is not None and results:
        # A replay's target and comparison are sent at the same time; bench levels one by one.
        plot(
            plot_path,
            results,
            x_label,
            _plot_title(command, settings),
            objectives,
            concurrent=command == "replay",
        )
        click.echo(f"wrote {plot_path}")
    if interrupted:
        click.echo("interrupted: the figures above cover what ran before Ctrl-C", err=True)
        raise SystemExit(INTERRUPTED)
    if not all(v.ok for v in verdicts):
        raise SystemExit(SLO_VIOLATED)


def _levels(
    concurrency: list[int] | None, rate: list[float] | None, common: dict[str, object]
) -> tuple[list[LoadLevel], str]:
    if concurrency and rate:
        raise click.UsageError("give --concurrency (closed loop) or --rate (open loop), not both")
    if rate:
        return [LoadLevel(rate=r, **common) for r in rate], "offered rate (requests/s)"  # type: ignore[arg-type]
    return [LoadLevel(concurrency=c, **common) for c in (concurrency or [1])], "concurrency"  # type: ignore[arg-type]


def _plot_title(command: str, settings: dict[str, object]) -> str:
    """ "ortserve bench: small_mlp", or "ortserve replay: a.ocap, b.ocap" (names, not a list)."""
    subject = settings.get("model")
    capture = settings.get("capture")
    if subject is None and isinstance(capture, list):
        subject = ", ".join(Path(str(p)).name for p in capture)
    return f"ortserve {command}: {subject}"


def _needs_matplotlib(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Refuse --plot before the run, not after it, when matplotlib is missing."""
    if value is not None and not plot_available():
        raise click.BadParameter("needs matplotlib: pip install 'ortserve[plot]'")
    return value


def _report_options(command: Callable[..., None]) -> Callable[..., None]:
    """--output, --plot and --progress, shared by bench and replay."""
    command = click.option(
        "--progress/--no-progress", default=None, help="Progress line on stderr (default: when a terminal)."
    )(command)
    command = click.option(
        "--plot",
        "plot_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        callback=_needs_matplotlib,
        help="Write a PNG plot here (needs ortserve[plot]).",
    )(command)
    return click.option(
        "--output",
        "-o",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Write the JSON result here.",
    )(command)


@click.command()
@click.argument("url")
@click.option("--model", "-m", default=None, help="Model name (required unless --route).")
@click.option("--model-version", default=None, help="Model version (default: the server's policy).")
@click.option(
    "--route",
    default=None,
    help="POST the --body-file bodies to this application route (/v1/predict, /v1/route) "
    "instead of a model's infer endpoint.",
)
@click.option(
    "--transport",
    type=click.Choice(["http-json", "http-binary", "grpc", "openai"]),
    default="http-json",
    help="OIP JSON bodies, Triton's binary tensor extension (binary outputs too), gRPC "
    "(URL: host:port of the gRPC listener; inputs as raw_input_contents), or openai: streamed "
    "/v1/completions of an LLM (time to first token, inter-token latency, tokens/s).",
)
@click.option("--prompt-tokens", type=int, default=128, help="openai: prompt length in tokens.")
@click.option("--max-tokens", type=int, default=128, help="openai: tokens generated per request.")
@click.option("--batch-size", type=int, default=1, help="Rows per request (dim 0 of generated inputs).")
@click.option("--shape", multiple=True, help="NAME=D1,D2 for inputs with other dynamic dimensions.")
@click.option(
    "--input-file",
    "--body-file",
    "input_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help=".npz (one array per input, rows along dim 0) or .jsonl (one OIP request body a line).",
)
@click.option(
    "--concurrency", "-c", callback=_concurrencies, default=None, help="Closed loop: levels, e.g. 1,4,16."
)
@click.option(
    "--rate", "-r", callback=_rates, default=None, help="Open loop: requests/s levels, e.g. 100,500."
)
@click.option(
    "--arrivals", type=click.Choice(["poisson", "uniform"]), default="poisson", help="Open-loop gaps."
)
@click.option("--duration", "-d", type=float, default=10.0, help="Seconds measured per level.")
@click.option(
    "--requests", "-n", type=int, default=None, help="Requests measured per level (instead of --duration)."
)
@click.option("--warmup", type=float, default=1.0, help="Seconds of unmeasured load before each level.")
@click.option("--timeout", type=float, default=30.0, help="Seconds before a request counts as timed out.")
@click.option("--connections", type=int, default=64, help="Open loop: most connections in use.")
@click.option("--processes", "-p", type=int, default=1, help="Generator processes (one per core).")
@click.option("--seed", type=int, default=0, help="Seeds generated inputs and Poisson arrivals.")
@click.option("--slo", multiple=True, help="Objective, e.g. p99=20ms or error_rate=0.1%; exit 3 if missed.")
@_report_options
def bench(
    url: str,
    model: str | None,
    model_version: str | None,
    route: str | None,
    transport: str,
    prompt_tokens: int,
    max_tokens: int,
    batch_size: int,
    shape: tuple[str, ...],
    input_file: Path | None,
    concurrency: list[int] | None,
    rate: list[float] | None,
    arrivals: str,
    duration: float,
    requests: int | None,
    warmup: float,
    timeout: float,
    connections: int,
    processes: int,
    seed: int,
    slo: tuple[str, ...],
    output: Path | None,
    plot_path: Path | None,
    progress: bool | None,
) -> None:
    """Load URL's MODEL (closed loop over concurrencies or open loop at rates) and report latency."""
    from ortserve.loadtest.pool import LoadRunner

    objectives = _objectives(slo)
    if route is not None:
        model = route_checked(route, transport, input_file)
    elif model is None:
        raise click.ClickException(
            "--model is required (or --route with --body-file for an application route)"
        )
    if transport == "openai":
        from ortserve.loadtest.llm_report import bench_llm

        if plot_path is not None or rate is not None:
            raise click.ClickException(
                "--transport openai takes --concurrency levels and --output (no --rate, --plot)"
            )

        spec_fields = {"model": model, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "seed": seed}
        bench_llm(url, spec_fields, concurrency or [1], duration, warmup, objectives, output)
        return
    request = RequestSpec(model, model_version, batch_size, seed, _shapes(shape), input_file, route)
    try:
        if transport == "grpc":
            target, wires = grpc_requests(url, request)
        else:
            target, wires = http_requests(url, "binary" if transport == "http-binary" else "json", request)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    common: dict[str, object] = {
        "arrivals": arrivals,
        "duration_s": None if requests else duration,
        "requests": requests,
        "warmup_s": warmup,
        "timeout_s": timeout,
        "connections": connections,
        "seed": seed,
    }
    levels, x_label = _levels(concurrency, rate, common)
    stream = _progress_stream(progress)
    results: list[LevelResult] = []
    with LoadRunner(target, wires, processes, stream) as runner:
        for level in levels:
            measurement: Measurement = runner.run(level)
            results.append(LevelResult(level.label, float(level.concurrency or level.rate or 0), measurement))
            if measurement.generator_cores > 0.9 * processes:
                click.echo(
                    f"warning: {level.label}: the generator kept {measurement.generator_cores:.2f} cores busy; "
                    "it may be the bottleneck (try --processes)",
                    err=True,
                )
            if runner.interrupted:
                break
    settings: dict[str, object] = {
        "url": url,
        "model": model,
        "model_version": model_version,
        "route": route,
        "transport": transport,
        "batch_size": batch_size,
        "input_file": str(input_file) if input_file else None,
        "processes": processes,
        "concurrency": concurrency,
        "rate": rate,
    } | common
    _finish("bench", settings, results, objectives, output, plot_path, x_label, runner.interrupted)


@click.command()
@click.argument("capture", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--target", "-t", required=True, help="Server to replay against, e.g. http://127.0.0.1:8000.")
@click.option("--speed", type=float, default=1.0, help="Time compression: 5 sends five times faster.")
@click.option(
    "--compare", "compare_url", default=None, help="Also send each request here and compare outputs."
)
@click.option("--model", "-m", default=None, help="Replay only this model's requests.")
@click.option("--connections", type=int, default=64, help="Most connections in use per target.")
@click.option("--timeout", type=float, default=30.0, help="Seconds before a request counts as timed out.")
@click.option("--slo", multiple=True, help="Objective on the target, e.g. p99=20ms; exit 3 if missed.")
@_report_options
def replay(
    capture: tuple[Path, ...],
    target: str,
    speed: float,
    compare_url: str | None,
    model: str | None,
    connections: int,
    timeout: float,
    slo: tuple[str, ...],
    output: Path | None,
    plot_path: Path | None,
    progress: bool | None,
) -> None:
    """Replay CAPTURE files (or folders) from `ortserve serve --capture-dir` at their recorded pace."""
    from ortserve.loadtest.llm_replay import is_generation, replay_generation
    from ortserve.loadtest.llm_report import render_llm_table
    from ortserve.loadtest.pool import Progress, StopOnSigint, run_loop
    from ortserve.loadtest.replay import ReplayResult, load_capture
    from ortserve.loadtest.replay import replay as run_replay
    from ortserve.loadtest.transports import HttpTarget

    objectives = _objectives(slo)
    if speed <= 0:
        raise click.BadParameter("must be positive", param_hint="--speed")
    try:
        records = load_capture(list(capture), model)
        primary = HttpTarget.parse(target)
        second = HttpTarget.parse(compare_url) if compare_url else None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    generation = [r for r in records if is_generation(r)]
    if generation:  # OpenAI requests: replayed (streams included) with a TTFT/ITL report
        records = [r for r in records if not is_generation(r)]
        generated = run_loop(replay_generation(generation, target, speed, timeout))
        click.echo(f"generation requests replayed: {len(generation)}")
        click.echo(render_llm_table([generated]))
        if not records:
            if output is not None:
                document = {"command": "replay", "generation": generated.as_dict()}
                output.write_text(json.dumps(document, indent=2), encoding="utf-8")
                click.echo(f"wrote {output}")
            return
    stream = _progress_stream(progress)
    shown = Progress(stream)
    stop = StopOnSigint()
    label = f"replay x{speed:g}"
    level = LoadLevel(rate=1.0, requests=len(records), duration_s=None)
    started = time.perf_counter()

    async def main() -> ReplayResult:
        return await run_replay(
            records, primary, speed, second, connections, timeout,
            stop.wrap(lambda drive: shown.show(level, started, drive.done, label)),
        )  # fmt: skip

    try:
        result = run_loop(main())
    finally:
        stop.restore()
        shown.end()
    results = [LevelResult(f"{label} target", speed, result.target)]
    if result.second is not None:
        results.append(LevelResult(f"{label} compare", speed, result.second))
    if result.comparison is not None:
        click.echo(result.comparison.render())
    settings: dict[str, object] = {
        "capture": [str(p) for p in capture],
        "requests": len(records),
        "target": target,
        "compare": compare_url,
        "speed": speed,
        "model": model,
        "connections": connections,
        "comparison": result.comparison.to_dict() if result.comparison else None,
    }
    _finish("replay", settings, results, objectives, output, plot_path, "speed", stop.fired, judged=1)
