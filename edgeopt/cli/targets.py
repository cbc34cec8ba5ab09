"""``edgeopt targets list`` / ``edgeopt targets show NAME``: the device profiles under ``targets/``."""

from __future__ import annotations


from edgeopt import jsonio
import click


@click.group()
def targets() -> None:
    """Device profiles (targets/*.toml; more folders with $EDGEOPT_TARGETS)."""


@targets.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON.")
def list_command(as_json):
    """List the device profiles and whether this host is the device or would emulate it."""
    from rich.table import Table

    from edgeopt.device.host import host_info
    from edgeopt.report_console import console
    from edgeopt.targets import list_targets

    host, found = host_info(), list_targets()
    if as_json:
        click.echo(jsonio.dumps([t.describe() | {"this_host": t.is_host(host)} for t in found], indent=2))
        return
    table = Table(title=f"device profiles (this host: {host.cpu_model}, {host.usable_cpus} CPUs)")
    for column in ("name", "device", "runtime", "p50/p99 ms", "this host"):
        table.add_column(column, no_wrap=column != "device")
    for t in found:
        b, s = t.budgets, t.settings
        table.add_row(t.name, t.device.name, f"{s.runtime} {s.threads}T {s.inference_precision}",
                      f"{b.p50_ms:g}/{b.p99_ms:g}", "yes" if t.is_host(host) else "emulated")
    console().print(table)


@targets.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the resolved profile as JSON.")
def show_command(name, as_json):
    """Show profile NAME with everything it inherits resolved, and how this host would measure it."""
    from rich.table import Table

    from edgeopt.device.budgets import BUDGET_FIELDS
    from edgeopt.device.host import host_info
    from edgeopt.report_console import console
    from edgeopt.targets import load_target, plan_emulation

    target = load_target(name)
    emulation = plan_emulation(target, host_info())
    if as_json:
        click.echo(jsonio.dumps(target.describe() | {"emulation_note": emulation.note if emulation else None},
                              indent=2))
        return
    out = console()
    chain = f" (extends {' → '.join(target.extends)})" if target.extends else ""
    out.print(f"[bold]{target.name}[/bold]: {target.description}\nsource: {target.source}{chain}")
    d = target.device
    out.print(f"device: {d.name}; {d.cpu}; {d.arch}, {d.cores} cores, {d.memory_mb} MB; ISA {', '.join(d.isa) or '-'}")
    s = target.settings
    out.print(f"runtime: {s.runtime}, threads {s.threads}, streams {s.streams}, hint {s.performance_hint}, "
              f"inference precision {s.inference_precision}")
    out.print(f"model precisions (preferred first): {', '.join(target.precisions)}")
    if target.input_shapes:
        out.print("input shapes: " + ", ".join(f"{k}={list(v)}" for k, v in target.input_shapes.items()))
    table = Table(title="budgets")
    for column in ("budget", "limit", "limits"):
        table.add_column(column)
    for key, value in target.budgets.items():
        _, unit, description = BUDGET_FIELDS[key]
        table.add_row(key, f"{value:g} {unit}".strip(), description)
    out.print(table)
    out.print(emulation.note if emulation else "this host is the device: measured natively")
