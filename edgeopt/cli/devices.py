"""``edgeopt devices list`` / ``edgeopt devices check NAME``: the devices of devices.toml and whether they are
ready to measure on."""

from __future__ import annotations

import click

from edgeopt.jsonio import dumps


@click.group()
def devices() -> None:
    """Real devices to measure on over SSH (devices.toml; more files with $EDGEOPT_DEVICES)."""


@devices.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the devices as JSON.")
def list_command(as_json):
    """List the devices of every devices.toml on the search path (nothing is contacted)."""
    from rich.table import Table

    from edgeopt.remote.devices import list_devices, search_path
    from edgeopt.reporting.console import console

    found = list_devices()
    if as_json:
        click.echo(dumps([d.describe() for d in found], indent=2))
        return
    if not found:
        click.echo(f"no devices (looked in {', '.join(str(p) for p in search_path())})")
        return
    table = Table(title="devices")
    for column in ("name", "address", "profile", "python", "slots", "defined in"):
        table.add_column(column)
    for d in found:
        table.add_row(d.name, d.address, d.profile, d.python, str(d.concurrency), str(d.source))
    console().print(table)


@devices.command("check")
@click.argument("name")
@click.option("--target", default=None, help="Profile of an ssh:// device (a named device has its own).")
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
def check_command(name, target, as_json):
    """Connect to device NAME: reachability, CPU/ISA/memory/OS, runtime versions, and whether its Python has
    numpy and the runtime its profile needs (with the pip line when not). Exit 0 ready, 5 not."""
    from edgeopt.errors import DeviceError
    from edgeopt.remote.check import check_device

    readiness = check_device(name, target)
    if as_json:
        click.echo(dumps(readiness.describe(), indent=2))
    else:
        for line in readiness.lines():
            click.echo(line)
    if not readiness.ready:
        raise DeviceError(f"device '{name}' is not ready: {readiness.problem}")
