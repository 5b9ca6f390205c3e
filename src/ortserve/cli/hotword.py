"""``ortserve hotword``: the hotword seed application's tools (train a version from a search log)."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["hotword"]


@click.group()
def hotword() -> None:
    """The hotword seed application: train a model version from a search log."""


@hotword.command()
@click.option(
    "--log",
    "log_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="JSON Lines, one search a line: query, clicked, timestamp (Unix ms), region_id.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The new version folder, e.g. models/hotword/2 (the server picks it up when complete).",
)
@click.option("--seed", type=int, default=7, help="Seeds the generated searches and the ranker.")
@click.option(
    "--generated", type=int, default=4000, help="Generated searches mixed in (keep seasons covered)."
)
@click.option("--epochs", type=int, default=12, help="Ranker training epochs.")
def train(log_path: Path, out: Path, seed: int, generated: int, epochs: int) -> None:
    """Build the corpus (new words, heat) and ranker from LOG into the version folder OUT."""
    from ortserve.apps.hotword.log_training import train_from_log
    from ortserve.errors import ConfigError

    try:
        searches, added = train_from_log(log_path, out, seed=seed, generated=generated, epochs=epochs)
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"trained {out} from {searches:,} searches; {added} new hotwords")


@hotword.command("example-log")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--size", type=int, default=4000, help="Searches to write.")
@click.option("--seed", type=int, default=7)
def example_log_command(out: Path, size: int, seed: int) -> None:
    """Write the demo's generated search log to OUT, in the format `train` reads."""
    from ortserve.apps.hotword.log_training import example_log

    with out.open("w", encoding="utf-8") as file:
        for line in example_log(size, seed):
            file.write(line + "\n")
    click.echo(f"wrote {size:,} searches to {out}")
