"""What every command and subcommand promises (docs/cli.md), tried as a user tries it: a bad option with --json
gives the documented JSON error and exit 2; -h works and shows types in words; -V prints the version; a reader that
goes away (`| head`) ends the command the Unix way (SIGPIPE, 141 in the shell) without a traceback; no arguments
prints help once and exits 2. The commands are read from the Typer app, so a new command is covered when it is
added. What only a real process shows (the installed entry point, its version, pipes and signals) runs through
the installed `trainready`; the rest runs the same entry function (cli.main.run) in this process (issue 25)."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import jsonschema
import pytest
import typer

from trainready.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
ENTRY = Path(sys.executable).with_name("trainready")  # the console script pip installed: cli.main.run
ERROR_SCHEMA = json.loads((ROOT / "docs" / "schemas" / "error.schema.json").read_text())
LOGS = ROOT / "tests" / "fixtures" / "run" / "logs"
F_SETPIPE_SZ = 1031  # Linux fcntl: set a pipe's capacity
PYTHON_TYPES = re.compile(r"<(bool|str|int|float|path|Path|list\[[^>]*\]|dict\[[^>]*\]|tuple\[[^>]*\])>")


def _walk(command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    found = [(path, command)]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += _walk(sub, (*path, name))
    return found


COMMANDS = _walk(typer.main.get_command(app))
PATHS = [path for path, _ in COMMANDS]
GROUPS = [path for path, cmd in COMMANDS if getattr(cmd, "commands", None) and getattr(cmd, "no_args_is_help", False)]
REQUIRED_ARGS = [(path, [p.metavar or p.name.upper() for p in cmd.params if p.param_type_name == "argument" and p.required])
                 for path, cmd in COMMANDS if not getattr(cmd, "commands", None)]


def ids(path: tuple[str, ...]) -> str:
    return " ".join(path) or "trainready"


def user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINREADY_", "PYTHONUNBUFFERED"))}
    env.update({"COLUMNS": "80", "TRAINREADY_NO_IMDS": "1", **extra})
    return env


def installed(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The installed console script in a process of its own, as a user's shell runs it."""
    env = user_env()
    return subprocess.run([str(ENTRY), *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def trainready(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The console script's entry function (cli.main.run) in this process, at 80 columns."""
    from cloud_stubs import cli_run

    return cli_run(*args, columns=80, cwd=cwd)


def test_the_walk_sees_every_command():
    assert [ids(p) for p in GROUPS] == ["trainready", "catalog", "ckpt", "data"]  # `check` alone runs the checks
    assert {ids(p) for p in PATHS} >= {"trainready", "estimate", "plan", "run", "report", "diagnose", "catalog",
                                       "catalog gpus", "catalog instances", "catalog models", "check", "check collect",
                                       "ckpt", "ckpt ls", "ckpt verify", "ckpt pull", "ckpt prune", "data", "data pack",
                                       "data bench"}
    assert ENTRY.is_file(), f"{ENTRY}: install the package (pip install -e .)"


def assert_json_error(proc: subprocess.CompletedProcess, starts: str) -> str:
    """The documented --json error: one JSON object on stdout, the same message on stderr, exit 2."""
    assert proc.returncode == 2, proc.stderr
    body = json.loads(proc.stdout)
    jsonschema.validate(body, ERROR_SCHEMA)
    assert set(body) == {"schema_version", "error"} and set(body["error"]) == {"message", "exit_code"}
    assert body["schema_version"] == 1 and body["error"]["exit_code"] == 2
    message = body["error"]["message"]
    assert message.startswith(starts), message
    assert proc.stderr == f"error: {message}\n"
    return message


# ------------------------------------------------------------------------ (a) errors with --json

@pytest.mark.parametrize("path", PATHS, ids=ids)
def test_unknown_option_with_json_prints_the_json_error_and_exits_2(path):
    message = assert_json_error(trainready(*path, "--no-such-option", "--json"), "No such option: --no-such-option")
    assert message.endswith(f"(try '{' '.join(('trainready', *path))} -h' for help)")


@pytest.mark.parametrize("path, arguments", [(p, a) for p, a in REQUIRED_ARGS if a], ids=lambda x: ids(x) if
                         isinstance(x, tuple) else "")
def test_missing_argument_with_json_prints_the_json_error_and_exits_2(path, arguments):
    if path == ("run",):  # the training command after `--` is checked by run itself
        assert_json_error(trainready("run", "--json"), "no training command: put it after `--`")
        return
    assert_json_error(trainready(*path, "--json"), f"Missing argument '{arguments[0]}'")


# ------------------------------------------------------------------------ (b) help

@pytest.mark.parametrize("path", PATHS, ids=ids)
def test_help_works_and_names_types_in_words(path):
    short = trainready(*path, "-h")
    assert (short.returncode, short.stderr) == (0, ""), short.stderr
    assert f"Usage: {' '.join(('trainready', *path))} " in short.stdout
    assert PYTHON_TYPES.findall(short.stdout) == [], "Python type names in -h"
    assert max(len(line) for line in short.stdout.splitlines()) <= 80  # COLUMNS=80: nothing wider
    assert "\u2026" not in short.stdout  # nor cut: Rich ends a word too long for its column with an ellipsis


def test_help_text_in_brackets_is_shown_as_written():
    # typer reads help as Rich markup: "[default: ...]" written in our help text vanished
    words = " ".join(trainready("estimate", "-h").stdout.replace("│", " ").split())
    assert "Sequence length. [default: the model's context, at most 4096]" in words
    assert "LoRA rank. [default: 16]" in words
    assert "attention, mlp, all-linear. [default: all-linear]" in words


def test_help_long_and_short_are_the_same():
    assert trainready("ckpt", "ls", "--help").stdout == trainready("ckpt", "ls", "-h").stdout


# ------------------------------------------------------------------------ (c) version

@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag):
    proc = installed(flag)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"trainready {version('trainready')}\n", "")


# ------------------------------------------------------------------------ (d) the reader goes away

def _shell_status_with_reader(args: tuple[str, ...], *, read_first_line: bool, **env: str) -> tuple[str, str]:
    """Run `trainready ARGS` in bash with stdout into a one-page pipe whose reader reads nothing (closed
    before the command starts) or reads the first line and closes (`| head -1`, made deterministic:
    the output is larger than the pipe, so the command is still writing when the reader goes).
    Returns (the first line read, bash's stderr: the command's own stderr then `exit=$?`)."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    if not read_first_line:
        os.close(read_end)
    proc = subprocess.Popen(["bash", "-c", '"$@"; echo "exit=$?" >&2', "bash", str(ENTRY), *args],
                            stdout=write_end, stderr=subprocess.PIPE, text=True, env=user_env(**env))
    os.close(write_end)
    first = b""
    if read_first_line:
        while not first.endswith(b"\n") and (byte := os.read(read_end, 1)):
            first += byte
        os.close(read_end)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0  # bash itself
    return first.decode(), stderr


# outputs well over a one-page pipe at 80 columns (checked below: the reader must go while they write)
LONG_OUTPUTS = [("catalog", "instances", "--json"), ("catalog", "models", "--json"),
                ("plan", "--model", "llama-2-13b", "--tokens", "2e9", "--json"), ("diagnose", str(LOGS)),
                ("diagnose", str(LOGS), "--json")]


@functools.cache
def output_size(args: tuple[str, ...]) -> int:
    return len(trainready(*args).stdout)


# PYTHONUNBUFFERED=1 (common in containers) makes Python write stdout unbuffered: a write the reader
# stops halfway through must still end in SIGPIPE, not a silent exit 0 with the output cut short
PYTHON_ENVS = {"buffered": {}, "PYTHONUNBUFFERED=1": {"PYTHONUNBUFFERED": "1"}}


@pytest.mark.parametrize("python_env", sorted(PYTHON_ENVS))
@pytest.mark.parametrize("args", LONG_OUTPUTS, ids=" ".join)
def test_head_1_ends_the_command_with_sigpipe_and_no_traceback(args, python_env):
    assert output_size(args) > 2 * 4096, "pick a longer output: this one fits in the pipe"
    first, stderr = _shell_status_with_reader(args, read_first_line=True, **PYTHON_ENVS[python_env])
    assert first.strip() != ""
    assert stderr == "exit=141\n"  # 128 + SIGPIPE, and nothing else: no traceback, no "Exception ignored"


@pytest.mark.parametrize("path", PATHS, ids=ids)
def test_help_into_a_closed_pipe_ends_with_sigpipe(path):
    assert _shell_status_with_reader((*path, "-h"), read_first_line=False) == ("", "exit=141\n")


def test_json_error_into_a_closed_pipe_ends_with_sigpipe():
    _, stderr = _shell_status_with_reader(("diagnose", "missing.log", "--json"), read_first_line=False)
    assert stderr == "error: cannot read log file missing.log: no such file or directory\nexit=141\n"


# ------------------------------------------------------------------------ (e) no arguments

@pytest.mark.parametrize("path", GROUPS, ids=ids)
def test_no_arguments_prints_help_once_and_exits_2(path):
    proc = trainready(*path)
    assert proc.returncode == 2
    assert proc.stdout.count("Usage: ") == 1 and f"Usage: {' '.join(('trainready', *path))} " in proc.stdout
    assert proc.stderr == ""


# ------------------------------------------------------------------------ run's numbers and region

@pytest.mark.parametrize(("args", "message"), [
    (("--usd-per-hour", "nan"), "Invalid value for '--usd-per-hour': nan is not a finite number"),
    (("--budget-usd", "1e309"), "Invalid value for '--budget-usd': 1e309 is not a finite number"),
    (("--grace", "0.5"), "Invalid value for '--grace': 0.5 is not a number from 1 to 86,400"),
    (("--keep-hot", "0"), "Invalid value for '--keep-hot': 0 is not a whole number from 1"),
    (("--mtbf-hours", "-1"), "Invalid value for '--mtbf-hours': -1 is not a number above 0"),
    (("--scaling-steps", "2.5"), "Invalid value for '--scaling-steps': 2.5 is not a whole number"),
    (("--resume", "--emit", "slurm"), "--resume continues a run in --run-dir; --emit writes a launch file"),
    (("--resume", "--scaling", "1,2"), "--resume continues a run in --run-dir; --emit writes a launch file"),
    (("--instance", "p4d.24xlarge", "--region", "us-est-1"),
     "unknown region 'us-est-1'. Did you mean: us-east-1? p4d.24xlarge has a price in: us-east-1."),
], ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_run_refuses_bad_numbers_and_regions_before_starting(args, message, tmp_path):
    proc = trainready("run", "--run-dir", str(tmp_path / "run"), *args, "--", "true")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith(f"error: {message}") and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
