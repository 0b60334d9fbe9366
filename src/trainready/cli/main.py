"""The `trainready` command. Exit codes (every command): 0 success; 1 the command ran but its
answer is negative (plan: nothing fits the constraints; ckpt: a checkpoint is damaged); 2 usage
error (bad option, unknown name, impossible setup, unreadable file or location); 3 internal
error (a bug: please report it); 130 interrupted (Ctrl-C); and, like any Unix tool, killed by
SIGPIPE (141 in the shell) when the reader of its output goes away (`| head`)."""

from __future__ import annotations

import errno
import functools
import os
import select
import signal
import stat
import sys
from typing import Any

import typer
from rich.markup import escape

try:  # typer >= 0.2x ships its own copy of click; older ones use click itself
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_errors

from trainready.errors import TrainreadyError, printable
from trainready.version import __version__

from . import account_cmd, catalog_cmd, check_cmd, ckpt_cmd, data_cmd, diagnose_cmd, estimate_cmd, plan_cmd, run_cmd
from .console import error

app = typer.Typer(
    name="trainready", no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
    help="Plan, check, checkpoint and run LLM training on rented GPU nodes.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(catalog_cmd.app, name="catalog")
app.add_typer(check_cmd.app, name="check")
app.add_typer(ckpt_cmd.app, name="ckpt")
app.add_typer(data_cmd.app, name="data")
app.command("estimate", help=estimate_cmd.HELP)(estimate_cmd.estimate)
app.command("plan", help=plan_cmd.HELP)(plan_cmd.plan)
app.command("account", help=account_cmd.HELP)(account_cmd.account)
app.command("run", help=run_cmd.HELP, context_settings={"allow_interspersed_args": False})(run_cmd.run)
app.command("report", help=run_cmd.REPORT_HELP)(run_cmd.report)
app.command("diagnose", help=diagnose_cmd.HELP)(diagnose_cmd.diagnose)


def _type_label(param: object, ctx: object) -> str | None:
    """The type column of `-h` in words a user types: INT, FLOAT, TEXT, PATH, or the choices;
    nothing for flags and arguments (their name says it), never Python's `<bool>` or `<list[str]>`."""
    if getattr(param, "is_flag", False) or getattr(param, "param_type_name", "") == "argument":
        return None
    if getattr(param, "metavar", None):  # the option names its own, e.g. DIR
        return param.metavar
    label = type(param).display_type(param, ctx).strip("<>")  # type: ignore[attr-defined]
    if label.startswith("list[") and label.endswith("]"):
        label = label[5:-1]
    label = label.split(" range")[0]  # the range itself is in the help text
    return {"int": "INT", "float": "FLOAT", "str": "TEXT", "path": "PATH", "file": "PATH",
            "directory": "DIR", "bool": None}.get(label, label)


def _plain_help(command: Any) -> None:
    """Help as written: typer reads help text as Rich markup, so "[default: 16]" in it vanished.
    Escaped here once for every command and option; and plain type names (see _type_label)."""
    def plain(param: Any) -> Any:
        if param is None or getattr(param, "_trainready_plain", False):  # escaped once: click may hand it back
            return param
        if hasattr(type(param), "display_type"):  # typer >= 0.2x
            param.display_type_rich = functools.partial(_type_label, param)
        if isinstance(getattr(param, "help", None), str):
            param.help = escape(param.help)
        param._trainready_plain = True
        return param

    for attr in ("help", "short_help", "epilog"):
        if isinstance(getattr(command, attr, None), str):
            setattr(command, attr, escape(getattr(command, attr)))

    for param in command.params:
        plain(param)
    help_option = command.get_help_option  # made per context: -h/--help
    command.get_help_option = lambda ctx: plain(help_option(ctx))
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trainready {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """trainready"""


def _fd_kinds() -> tuple[int, ...]:
    kinds = []
    for fd in (1, 2):
        try:
            kinds.append(stat.S_IFMT(os.fstat(fd).st_mode))
        except OSError:
            kinds.append(0)
    return tuple(kinds)


def _output_closed(kinds_at_start: tuple[int, ...] = ()) -> bool:
    """True when stdout or stderr is a pipe whose reader has gone (`trainready ... | head`), or
    was a pipe and Rich has already put /dev/null in its place (help text goes through Rich)."""
    if any(was == stat.S_IFIFO and now == stat.S_IFCHR for was, now in zip(kinds_at_start, _fd_kinds(), strict=False)):
        return True
    for stream in (sys.stdout, sys.stderr):
        try:
            poller = select.poll()
            poller.register(stream.fileno(), select.POLLOUT)
            if any(events & select.POLLERR for _fd, events in poller.poll(0)):
                return True
        except (OSError, ValueError):
            continue
    return False


def _die_of_sigpipe() -> None:
    """What `yes | head` does: end silently, killed by SIGPIPE, so shells see 141."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())  # nothing more reaches the closed pipe, even at exit
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    sys.exit(141)  # not reached on POSIX


def _usage_error(exc: click_errors.UsageError, as_json: bool) -> int:
    """Click's parse errors, in our format: one line naming the bad value, then where help is."""
    message = exc.format_message().replace("Value error, ", "")  # pydantic's prefix on our own message
    if exc.ctx is not None:
        message += f" (try '{exc.ctx.command_path} -h' for help)"
    error(message, as_json=as_json, exit_code=2)
    return 2


@functools.cache
def _command() -> Any:
    """The Click command tree, built from the Typer app once per process. Building it reads every command's
    signature (about 30 ms); a process that calls run() more than once (the test suite, a tool that embeds us)
    paid that on every call. _plain_help escapes in place, so it must run once per tree too."""
    command = typer.main.get_command(app)
    _plain_help(command)
    return command


def _main(as_json: bool) -> int:
    command = _command()
    try:
        result = command.main(prog_name="trainready", standalone_mode=False)
    except click_errors.NoArgsIsHelpError:  # `trainready`, `trainready ckpt`: click printed the help
        return 2
    except click_errors.UsageError as exc:
        return _usage_error(exc, as_json)
    except click_errors.ClickException as exc:  # e.g. a file Click could not open
        error(exc.format_message(), as_json=as_json, exit_code=2)
        return 2
    except typer.Abort:
        return 130
    except TrainreadyError as exc:
        error(str(exc), as_json=as_json, exit_code=exc.exit_code)
        return exc.exit_code
    except OSError as exc:
        if exc.errno not in _THE_USERS_TO_FIX or not exc.filename or os.environ.get("TRAINREADY_DEBUG"):
            raise  # no path named (a write on an open file) or debugging: the internal-error path, with its traceback
        # a path the user gave that the system refuses (read-only, full, no permission): exit 2, naming it
        error(f"cannot use {printable(exc.filename)}: {exc.strerror or exc}", as_json=as_json, exit_code=2)
        return 2
    return result if isinstance(result, int) else 0


_THE_USERS_TO_FIX = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG,
                     errno.ENOTDIR, errno.EISDIR, errno.ELOOP}
"""OSErrors a command meets because of where the user pointed it, not because of a bug: usage errors (exit 2)."""


def run() -> None:
    as_json = "--json" in sys.argv
    kinds = _fd_kinds()
    try:
        code = _main(as_json)
        sys.stdout.flush()
    except KeyboardInterrupt:
        code = 130
    except SystemExit:  # click and Rich turn EPIPE into a silent exit 1 of their own
        if _output_closed(kinds):
            _die_of_sigpipe()
        raise
    except BrokenPipeError:
        if not _output_closed():
            raise
        _die_of_sigpipe()
    except Exception as exc:  # a bug: say so plainly, keep the traceback for who asks
        if isinstance(exc, OSError) and _output_closed():
            _die_of_sigpipe()
        if os.environ.get("TRAINREADY_DEBUG"):
            raise
        error(f"internal error: {type(exc).__name__}: {exc} (set TRAINREADY_DEBUG=1 for the traceback)",
              as_json=as_json, exit_code=3)
        code = 3
    sys.exit(code)
