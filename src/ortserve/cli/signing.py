"""``ortserve keygen`` and ``ortserve sign``: Ed25519 keys and signed model versions."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["keygen", "sign"]


@click.command()
@click.argument("keyfile", type=click.Path(dir_okay=False, path_type=Path))
def keygen(keyfile: Path) -> None:
    """Write a new Ed25519 private key to KEYFILE (mode 0600) and its public key to KEYFILE.pub."""
    from ortserve.repository.signature import generate_key

    if keyfile.exists():
        raise click.BadParameter(f"{keyfile} exists; not overwriting a key", param_hint="KEYFILE")
    public = generate_key(keyfile)
    click.echo(f"wrote {keyfile} (private, keep it secret) and {public} (give it to --trusted-keys)")


@click.command()
@click.argument("version_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--key",
    "key",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The Ed25519 private key written by `ortserve keygen`.",
)
def sign(version_dir: Path, key: Path) -> None:
    """Sign every file of VERSION_DIR (a model's numbered version folder)."""
    from ortserve.repository.signature import SignatureError, sign_version

    try:
        written = sign_version(version_dir, key)
    except SignatureError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"wrote {written}")
