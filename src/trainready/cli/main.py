"""The `trainready` command. Exit codes (every command): 0 success; 1 the command ran but its
answer is negative (plan: nothing fits the constraints; ckpt: a checkpoint is damaged); 2 usage
error (bad option, unknown name, impossible setup, unreadable file or location); 3 internal
error (a bug: please report it)."""

from __future__ import annotations

import os
import sys

import typer

from trainready import __version__
from trainready.errors import TrainreadyError

from . import catalog_cmd, check_cmd, ckpt_cmd, data_cmd, diagnose_cmd, estimate_cmd, plan_cmd, run_cmd
from .console import error

app = typer.Typer(
    name="trainready", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Plan, check, checkpoint and run LLM training on rented GPU nodes.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(catalog_cmd.app, name="catalog")
app.add_typer(check_cmd.app, name="check")
app.add_typer(ckpt_cmd.app, name="ckpt")
app.add_typer(data_cmd.app, name="data")
app.command("estimate", help=estimate_cmd.HELP)(estimate_cmd.estimate)
app.command("plan", help=plan_cmd.HELP)(plan_cmd.plan)
app.command("run", help=run_cmd.HELP, context_settings={"allow_interspersed_args": False})(run_cmd.run)
app.command("report", help=run_cmd.REPORT_HELP)(run_cmd.report)
app.command("diagnose", help=diagnose_cmd.HELP)(diagnose_cmd.diagnose)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trainready {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """trainready"""


def run() -> None:
    as_json = "--json" in sys.argv
    try:
        app()
    except TrainreadyError as exc:
        error(str(exc), as_json=as_json, exit_code=exc.exit_code)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # a bug: say so plainly, keep the traceback for who asks
        if os.environ.get("TRAINREADY_DEBUG"):
            raise
        error(f"internal error: {type(exc).__name__}: {exc} (set TRAINREADY_DEBUG=1 for the traceback)",
              as_json=as_json, exit_code=3)
        sys.exit(3)
