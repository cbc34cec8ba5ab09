"""Read a TOML file as edgeopt's data files (profiles, devices) are read: one-line errors, exit 2."""

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
