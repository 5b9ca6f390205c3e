"""The ``ortserve`` command group: its options, the ``demo`` command, and every other subcommand."""

from __future__ import annotations

import gc
from pathlib import Path

import click

from ortserve import __version__
from ortserve.cli.errors import show_envvars
from ortserve.cli.lazy import LazyGroup
from ortserve.cli.serve import serve

__all__ = ["main"]


# Imported when run: ``ortserve serve`` starts without the load generator or the quantizer.
_LAZY = {
    "bench": "ortserve.cli.loadtest:bench",
    "replay": "ortserve.cli.loadtest:replay",
    "keygen": "ortserve.cli.signing:keygen",
    "sign": "ortserve.cli.signing:sign",
    "quantize": "ortserve.cli.quantize:quantize",
    "hotword": "ortserve.cli.hotword:hotword",
}


@click.group(
    cls=LazyGroup,
    lazy=_LAZY,
    context_settings={
        "auto_envvar_prefix": "ORTSERVE",
        "show_default": True,
        "help_option_names": ["-h", "--help"],
    },
)
@click.version_option(__version__, prog_name="ortserve")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Serve ONNX models over the Open Inference Protocol (KServe v2)."""
    if ctx.invoked_subcommand == "serve":
        # Start-up allocates hundreds of thousands of objects that live as long as the server
        # (modules, classes, pydantic schemas), and the collector walked them again and again
        # (about 12% of the imports' CPU). Off until the server is loaded: freeze_startup_heap()
        # collects once, freezes what is alive and turns it back on (and so does the end of the
        # command, should it end before: a refused flag, a CliRunner in a test).
        gc.disable()
        ctx.call_on_close(gc.enable)


main.add_command(serve)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def demo(directory: Path) -> None:
    """Write the demo model repository (seeded MLPs, seed apps, a small LLM) into DIRECTORY."""
    from ortserve.demo import write_demo_repository
    from ortserve.llm.demo import write_demo_llm

    names = [*write_demo_repository(directory), write_demo_llm(directory)]
    click.echo(f"wrote {', '.join(names)} to {directory}")


show_envvars(main)
