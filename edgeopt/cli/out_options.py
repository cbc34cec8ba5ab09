"""``--force`` and the up-front check of every path a command will write (``edgeopt.out_guard``)."""

from __future__ import annotations

import click

force_option = click.option("--force", is_flag=True,
                            help="Replace --out even when it is not something edgeopt wrote (a user's folder or "
                                 "file). Without it such an --out is refused before any work (exit 2).")


def guard_outputs(out: str | None, force: bool, *, needs_bytes: int = 0, json_out: str | None = None,
                  junit_out: str | None = None, bundle: str | None = None) -> None:
    """Refuse, before any work, outputs that would replace what edgeopt did not write or cannot be written."""
    from edgeopt import out_guard

    if out is not None:
        out_guard.check_out_folder(out, force, needs_bytes)
    if bundle:
        out_guard.check_out_file(bundle, force, needs_bytes, option="--package" if out else "--out",
                                 own=out_guard.is_own_bundle)
    for option, path in (("--json", json_out), ("--junit", junit_out)):
        if path and path != "-":
            out_guard.check_out_file(path, force, option=option, own=out_guard.is_own_report)
