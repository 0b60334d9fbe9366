"""Outputs a user already has, given one file at a time: `--nccl-tests FILE` (an nccl-tests run as it
printed) and `--dcgm-output FILE` (`dcgmi diag -r N`, its table or its -j JSON). Each becomes the
bundle file its check reads; a file that cannot be read, or whose collective cannot be told, is a
usage error (exit 2) naming it and what to do."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from trainready.errors import UsageError, printable
from trainready.io import parse_json
from trainready.io.files import read_regular

from .bundle import NCCL_OPS, limit

_OP = re.compile(r"\b(" + "|".join(NCCL_OPS) + r")_perf\b")
_OP_WORDS = ", ".join(NCCL_OPS)


def nccl_op(text: str, path: str) -> str | None:
    """The collective an nccl-tests output measured: its `Collective test starting: X_perf` line or the
    command it echoes, else the file name (all_reduce_perf.txt, nccl-tests-all_reduce.txt)."""
    head = "\n".join(text.splitlines()[:200])
    if m := _OP.search(head):
        return m.group(1)
    name = re.sub(r"[-_ ]", "", Path(path).name.lower())  # all_reduce, all-reduce, allreduce, AllReduce
    return next((op for op in sorted(NCCL_OPS, key=len, reverse=True) if op.replace("_", "") in name), None)


def _read(path: str, option: str, name: str) -> str:
    if not path:
        raise UsageError(f"{option} is an empty path: name the file")
    try:
        data = read_regular(os.path.realpath(path), limit(name))
    except FileNotFoundError:
        raise UsageError(f"{option} {printable(path)} does not exist") from None
    except OSError as exc:
        why = ("not a regular file" if exc.errno == errno.EINVAL else
               f"larger than the {limit(name) >> 20} MiB such an output may have" if exc.errno == errno.EFBIG else
               exc.strerror or str(exc))
        raise UsageError(f"{option} {printable(path)}: {why}") from None
    return data.decode("utf-8", errors="replace")


def single_files(nccl_tests: list[str], dcgm_output: str | None, origins: dict[str, str] | None = None) -> dict[str, str]:
    """Bundle file name -> text for each file given (`origins`, when given, gets bundle name -> the path
    as the user wrote it, so findings name their file). One nccl-tests file per collective."""
    files: dict[str, str] = {}
    origins = {} if origins is None else origins
    for path in nccl_tests:
        text = _read(path, "--nccl-tests", "nccl-tests-all_reduce.txt")
        op = nccl_op(text, path)
        if op is None:
            raise UsageError(f"--nccl-tests {printable(path)}: cannot tell which collective it measured (no "
                             f"'X_perf' in its first lines or its name); rename it after the op, e.g. "
                             f"all_reduce_perf.txt (ops: {_OP_WORDS})")
        name = f"nccl-tests-{op}.txt"
        if name in files:
            raise UsageError(f"--nccl-tests: two files for {op} ({printable(path)} and an earlier one): give one per collective")
        files[name] = text
        origins[name] = printable(path)
    if dcgm_output is not None:
        text = _read(dcgm_output, "--dcgm-output", "dcgm-diag.txt")
        name = "dcgm-diag.json" if _is_json(text) else "dcgm-diag.txt"
        files[name], origins[name] = text, printable(dcgm_output)
    return files


def _is_json(text: str) -> bool:
    stripped = text.lstrip()
    if not stripped.startswith("{"):
        return False
    try:
        parse_json(stripped)
    except (ValueError, RecursionError):
        return True  # a JSON object cut short (or nested past reason): judged, and reported unreadable, as JSON
    return True


def checks_for(files: dict[str, str]) -> tuple[str, ...]:
    """The checks that single files feed (the report shows only these): those whose `needs` name one of
    the files, and gpu.dcgm (it names its files itself, to say "not asked" when there is none)."""
    from . import checks  # noqa: F401  (registers every check)
    from .registry import CHECKS, needed_files

    ids = {"gpu.dcgm"} if any(n.startswith("dcgm-diag") for n in files) else set()
    ids |= {check_id for check_id, spec in CHECKS.items() if set(needed_files(spec.needs)) & set(files)}
    return tuple(sorted(ids))
