"""The ``ortserve`` command group: its options, the ``demo`` command, and every other subcommand."""

from __future__ import annotations

from pathlib import Path

import click

from ortserve import __version__
from ortserve.cli.errors import CleanErrorsGroup, show_envvars
from ortserve.cli.hotword import hotword
from ortserve.cli.loadtest import bench, replay
from ortserve.cli.quantize import quantize
from ortserve.cli.serve import serve
from ortserve.cli.signing import keygen, sign

__all__ = ["main"]


@click.group(
    cls=CleanErrorsGroup,
    context_settings={
        "auto_envvar_prefix": "ORTSERVE",
        "show_default": True,
        "help_option_names": ["-h", "--help"],
    },
)
@click.version_option(__version__, prog_name="ortserve")
def main() -> None:
    """Serve ONNX models over the Open Inference Protocol (KServe v2)."""


main.add_command(serve)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def demo(directory: Path) -> None:
    """Write the demo model repository (seeded MLPs, seed apps, a small LLM) into DIRECTORY."""
    from ortserve.demo import write_demo_repository
    from ortserve.llm.demo import write_demo_llm

    names = [*write_demo_repository(directory), write_demo_llm(directory)]
    click.echo(f"wrote {', '.join(names)} to {directory}")


main.add_command(bench)
main.add_command(replay)
main.add_command(keygen)
main.add_command(sign)
main.add_command(quantize)
main.add_command(hotword)
show_envvars(main)
