"""The layout the architecture promises (docs/architecture.md), checked by parsing every module's imports."""

from __future__ import annotations

import ast
from pathlib import Path

import edgeopt

PACKAGE = Path(edgeopt.__file__).parent
# What edgeopt/device/ may import from outside itself: lean, standard-library-only modules.
LEAN_EXTRA = {"edgeopt.errors", "edgeopt.atomic", "edgeopt.jsonio", "edgeopt.signals", "edgeopt.out_guard"}
# Modules that read a PyTorch module's forward() signature (the model's inputs), not a pass's.
FORWARD_SIGNATURE = {"torch_inputs.py", "hf.py"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every edgeopt module -> the edgeopt modules it imports, at module level or inside functions."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def test_no_import_cycle_inside_edgeopt():
    graph = _imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt == "edgeopt" or (nxt.startswith(node + ".") and node != "edgeopt"):
                continue  # importing a submodule runs its package's __init__ first, not a cycle of ours
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_device_imports_only_itself_errors_and_atomic():
    graph = _imports()
    outside = {f"{module} imports {target}" for module, targets in graph.items() if module.startswith("edgeopt.device")
               for target in targets if not target.startswith("edgeopt.device") and target not in LEAN_EXTRA
               and target != "edgeopt"}
    assert not outside, sorted(outside)


def test_pass_rules_live_in_passes():
    """No code outside passes/ asks for a pass by name or by stage string (the passes declare their contract)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "passes" in path.relative_to(PACKAGE).parts:
            continue
        text = path.read_text(encoding="utf-8")
        for needle in ('.stage == "', "get_pass(s.name).stage", '"qat" in', "== \"qat\"", "inspect.signature"):
            if needle == "inspect.signature" and str(path.relative_to(PACKAGE)) in FORWARD_SIGNATURE:
                continue
            if needle in text:
                offenders.append(f"{path.relative_to(PACKAGE)}: {needle}")
    assert not offenders, offenders


def test_passes_package_holds_no_logic():
    tree = ast.parse((PACKAGE / "passes" / "__init__.py").read_text(encoding="utf-8"))
    assert all(isinstance(node, ast.Expr) for node in tree.body)  # a docstring only


def test_public_names_are_not_shadowed_by_subpackages():
    """``edgeopt.compress`` / ``validate`` / ``optimize`` stay the API functions after every subpackage is
    imported (a subpackage of the same name would replace the attribute on import)."""
    import importlib

    import edgeopt

    for path in PACKAGE.rglob("__init__.py"):
        importlib.import_module(".".join(("edgeopt", *path.parent.relative_to(PACKAGE).parts)))
    for name in ("compress", "validate", "optimize"):
        assert callable(getattr(edgeopt, name)), f"edgeopt.{name} is {getattr(edgeopt, name)!r}"
