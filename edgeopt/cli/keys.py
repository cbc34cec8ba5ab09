"""``edgeopt keys generate``: an Ed25519 key pair for signing bundles."""

from __future__ import annotations

import click


@click.group()
def keys() -> None:
    """Signing keys for device bundles (see docs/signing.md)."""


@keys.command("generate")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Private key to write (mode 0600); the public key goes to OUT.pub. Neither may exist.")
def generate(out):
    """Write a new Ed25519 key pair. Set $EDGEOPT_KEY_PASSPHRASE to encrypt the private key with it.

    Exit 0 ok, 2 when either file exists (a key is never overwritten) or cannot be written.
    """
    from edgeopt.signing import generate_keys

    pair = generate_keys(out)
    click.echo(f"{pair.private}: private key (keep it secret: sign with --sign {pair.private})")
    click.echo(f"{pair.public}: public key, id {pair.key_id} (give it to devices: --trust {pair.public})")
