"""The ``edgeopt`` command line. Library errors become one-line messages and the documented exit codes."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings

import click

from edgeopt import __version__
from edgeopt.atomic import DISK_ERRNOS
from edgeopt.errors import EdgeoptError, first_line
from edgeopt.offline import decline_telemetry


class _Group(click.Group):
    """Turns exceptions into messages: typed errors keep their exit code, anything else is a bug (exit 1).
    SIGINT, SIGTERM and SIGHUP interrupt a run alike (``edgeopt.signals``): cleanup runs, exit 128 + signal."""

    def invoke(self, ctx: click.Context):
        from edgeopt import signals

        try:
            with signals.handled():
                return super().invoke(ctx)
        except EdgeoptError as exc:
            click.echo(f"edgeopt: {exc}", err=True)
            sys.exit(exc.exit_code)
        except click.UsageError as exc:  # a bad option value: one line too, like any bad input
            where = exc.ctx.command_path if exc.ctx else "edgeopt"
            click.echo(f"edgeopt: {exc.format_message()} (see '{where} --help')", err=True)
            sys.exit(exc.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except signals.Terminated as exc:
            click.echo(f"edgeopt: interrupted ({exc.name}); no output was written, temporary files removed", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("edgeopt: interrupted; no output was written", err=True)
            sys.exit(130)
        except Exception as exc:  # a bug: short message, full traceback in a private log
            if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:  # the machine's state, not a bug
                where = exc.filename or "a file it does not name (a library's temporary file, likely)"
                click.echo(f"edgeopt: the disk refused a write ({exc.strerror}) of {where}; free some space or "
                           f"fix the disk (temporary files go to {tempfile.gettempdir()}; TMPDIR moves them); no "
                           f"output was written", err=True)
                sys.exit(2)  # as atomic.WriteError for a full disk at the output
            from edgeopt.error_log import write_traceback

            log = write_traceback(exc)
            where = f"traceback in {log}" if log else "no traceback could be saved"
            click.echo(f"edgeopt: internal error: {type(exc).__name__}: {first_line(exc)} ({where})", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgeopt")
def main() -> None:
    """Compress, convert and validate neural networks for edge devices."""
    _quiet_libraries()
    decline_telemetry()


# Loggers whose chatter is not for a CLI user, and the lowest level still shown. Filters, not levels: these
# libraries reset their loggers' levels when they are imported, which happens later and lazily.
_LIBRARY_LOG_FLOORS = {"nncf": logging.WARNING, "torchao": logging.ERROR, "torch.utils._pytree": logging.ERROR,
                       "torch": logging.ERROR,
                       # a filter acts on the logger a record starts at only: "torchvision is not installed"
                       "torch.onnx._internal.exporter._registration": logging.ERROR}


def _quiet_libraries() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name, floor in _LIBRARY_LOG_FLOORS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _LevelFloor) for f in logger.filters):
            logger.addFilter(_LevelFloor(floor))


class _LevelFloor(logging.Filter):
    def __init__(self, floor: int):
        super().__init__()
        self.floor = floor

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.floor


def _register() -> None:
    from edgeopt.cli import compress
    from edgeopt.cli import devices as devices_cli
    from edgeopt.cli import fleet as fleet_cli
    from edgeopt.cli import golden as golden_cli
    from edgeopt.cli import keys as keys_cli
    from edgeopt.cli import optimize as optimize_cli
    from edgeopt.cli import package as package_cli
    from edgeopt.cli import targets as targets_cli
    from edgeopt.cli import validate

    main.add_command(compress.compress)
    main.add_command(devices_cli.devices)
    main.add_command(fleet_cli.fleet)
    main.add_command(golden_cli.golden)
    main.add_command(keys_cli.keys)
    main.add_command(optimize_cli.optimize)
    main.add_command(package_cli.package)
    main.add_command(package_cli.verify)
    main.add_command(targets_cli.targets)
    main.add_command(validate.validate)


_register()
