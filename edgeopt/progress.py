"""Progress bars on stderr (rich), silent when stderr is not a terminal or when asked to be quiet."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def progress_bar(label: str, total: int, quiet: bool = False) -> Iterator[Callable[[], None]]:
    """Yield ``advance()``, which moves the bar one step."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        yield lambda: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda: progress.advance(task)
