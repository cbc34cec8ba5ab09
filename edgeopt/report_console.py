"""Human-readable console output (rich). Plain text when stdout is not a terminal."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table


def console() -> Console:
    return Console(stderr=False, highlight=False, soft_wrap=True)


def format_bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def size_ratio(reference: int, size: int) -> str:
    """``3.51x smaller`` / ``1.02x larger``: how ``size`` compares with ``reference``."""
    return f"{reference / size:.2f}x smaller" if size <= reference else f"{size / reference:.2f}x larger"


def print_compress_result(result) -> None:
    out = console()
    out.print(f"recipe: {result.recipe.describe()}")
    for note in result.notes:
        out.print(f"  {note}")
    table = Table(title=f"artifacts in {result.out}")
    for column in ("model", "precision", "size", "vs FP32 IR", "top-1", "cosine", "quality gate"):
        table.add_column(column)
    reference = result.reference
    if result.fp32_ir_bytes:
        top1 = f"{reference.top1 * 100:.2f}%" if reference and reference.top1 is not None else "-"
        table.add_row("original (FP32 IR)", "fp32", format_bytes(result.fp32_ir_bytes), "1.00x", top1, "1", "reference")
    for artifact in result.artifacts:
        quality = result.qualities.get(artifact.format)
        top1 = f"{quality.top1 * 100:.2f}%" if quality and quality.top1 is not None else "-"
        cosine = f"{quality.fidelity.cosine:.5f}" if quality and quality.fidelity else "-"
        ratio = size_ratio(result.fp32_ir_bytes, artifact.bytes) if result.fp32_ir_bytes else "-"
        gate = result.gate_results.get(artifact.format)
        verdict = "-" if gate is None else ("PASS: " if gate[0] else "FAIL: ") + gate[1]
        table.add_row(artifact.path.name, artifact.precision, format_bytes(artifact.bytes), ratio, top1, cosine, verdict)
    out.print(table)
    print_output_fidelity(result, out)
    for fmt, versus in result.vs_fp32.items():
        flags = f" -- FLAGGED: {', '.join(versus.flags)}" if versus.flags else ""
        out.print(f"{fmt} vs FP32 {fmt} ({versus.settings.runtime}, {versus.settings.threads} threads): "
                  f"{versus.summary()}{flags}")
    fp32_weights = result.fp32_weight_bytes
    for fmt, weights in result.weight_bytes.items():
        ratio = f", {size_ratio(fp32_weights.total, weights.total)} than FP32 ({format_bytes(fp32_weights.total)})" \
            if fp32_weights and weights.total else ""
        out.print(f"weight bytes ({fmt}): {format_bytes(weights.total)}{ratio}")
    if result.steps is not None:
        print_step_report(result.steps, out)


def print_output_fidelity(result, out: Console) -> None:
    """One row per artifact and output, for models with more than one output; gated outputs are marked."""
    qualities = {name: q for name, q in result.qualities.items() if len(q.outputs) > 1}
    if not qualities:
        return
    table = Table(title="fidelity per output", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("artifact", "output", "gated", "cosine", "max abs err", "mean abs err", "top-1 agree"):
        table.add_column(column, justify="left" if column in ("artifact", "output", "gated") else "right",
                         no_wrap=True)
    for name, quality in qualities.items():
        gated = {f.output for f in result.gate.gated(quality)}
        for fidelity in quality.outputs:
            agreement = "-" if fidelity.top1_agreement is None else f"{fidelity.top1_agreement * 100:.2f}%"
            table.add_row(name, fidelity.output, "yes" if fidelity.output in gated else "no",
                          f"{fidelity.cosine:.5f}", f"{fidelity.max_abs_error:.4g}", f"{fidelity.mean_abs_error:.4g}",
                          agreement)
    Console(highlight=False, width=max(out.width, 110)).print(table)  # output names: never squeeze into 80


def print_step_report(report, out: Console) -> None:
    """One row per recipe step: what it cost and what it bought; "smaller" and "faster" compare with the original."""
    how = report.describe()["measured_with"]
    table = Table(title="after each step", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("step", "prec", "params", "MACs", "IR size", "smaller", "top-1", "cosine", "p50 ms", "faster"):
        table.add_column(column, justify="left" if column in ("step", "prec") else "right", no_wrap=True)
    first = report.rows[0]
    for row in report.rows:
        table.add_row(row.step, row.precision, _count(row.params), _count(row.macs),
                      format_bytes(row.ir_bytes), f"{first.ir_bytes / row.ir_bytes:.2f}x",
                      "-" if row.top1 is None else f"{row.top1 * 100:.2f}%",
                      "-" if row.cosine is None else f"{row.cosine:.4f}", f"{row.p50_ms:.3f}",
                      f"{first.p50_ms / row.p50_ms:.2f}x")
    Console(highlight=False, width=max(out.width, 120)).print(table)  # ten columns: never squeeze into 80
    out.print(f"latency: {how['latency']}; threads={report.settings.threads}, inference precision "
              f"{report.settings.inference_precision}; host {how['host_cpu']}; quality: {how['quality']}")


def _count(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.1f}K" if value >= 1e3 else str(value)
