"""Read a TOML file as edgeopt's data files (profiles, devices, plans, fleets) are read: one-line errors, exit 2."""

from __future__ import annotations

import tomllib
from pathlib import Path

from edgeopt.errors import BadInputError, first_line


def read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"{path}: cannot read ({first_line(exc)})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise BadInputError(f"{path}: not valid TOML ({first_line(exc)})") from exc


def check_keys(path: Path, where: str, table, allowed: set[str], required: set[str]) -> None:
    """``table`` is a table with only ``allowed`` keys and every ``required`` one; else a one-line error."""
    if not isinstance(table, dict):
        raise BadInputError(f"{path}: {where}: expected a table, got {table!r}")
    unknown, missing = set(table) - allowed, required - set(table)
    if unknown:
        raise BadInputError(f"{path}: {where}: unknown key(s) {', '.join(sorted(unknown))} "
                            f"(known: {', '.join(sorted(allowed))})")
    if missing:
        raise BadInputError(f"{path}: {where}: missing key(s) {', '.join(sorted(missing))}")
