"""``edgeopt targets list`` / ``edgeopt targets show NAME``: the device profiles under ``targets/``."""

from __future__ import annotations

import click


@click.group()
def targets() -> None:
    """Device profiles (targets/*.toml; more folders with $EDGEOPT_TARGETS)."""


@targets.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON.")
def list_command(as_json):
    """List the device profiles and whether this host is the device or would emulate it."""
    from edgeopt.device.host import host_info
    from edgeopt.reporting.console import emit, print_targets
    from edgeopt.targets import list_targets

    host, found = host_info(), list_targets()
    if as_json:
        emit([t.describe() | {"this_host": t.is_host(host)} for t in found], "", "-", quiet=False)
        return
    print_targets(found, host)


@targets.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the resolved profile as JSON.")
def show_command(name, as_json):
    """Show profile NAME with everything it inherits resolved, and how this host would measure it."""
    from edgeopt.device.host import host_info
    from edgeopt.reporting.console import emit, print_target
    from edgeopt.targets import load_target, plan_emulation

    target = load_target(name)
    emulation = plan_emulation(target, host_info())
    if as_json:
        emit(target.describe() | {"emulation_note": emulation.note if emulation else None}, "", "-", quiet=False)
        return
    print_target(target, emulation)
