"""Keep stdout for results: libraries' progress bars and logs go to stderr (or nowhere with --quiet)."""

from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def library_output(quiet: bool):
    """Within the block, anything printed to stdout (NNCF's progress bars, say) goes to stderr, or is dropped."""
    if quiet:
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    else:
        with contextlib.redirect_stdout(sys.stderr):
            yield
