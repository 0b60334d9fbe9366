"""Read a small text file a user named on the command line (`--job`, `--catalog`,
`--model-config`): every way it can be the wrong thing is a UsageError naming the file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trainready.errors import UsageError, printable

LIMIT = 16 * 1024 * 1024  # far above any job spec, catalog or config.json


def read_user_text(path: str | Path, what: str, *, limit: int = LIMIT, regular_only: bool = False) -> str:
    """The text of `path`, described to the user as `what` ("job file", "catalog file").

    Symlinks are followed (a Hugging Face cache is made of them) and pipes are read (`<(...)`),
    but a directory, a file over `limit` bytes (or /dev/zero) and bytes that are not UTF-8 text
    (a binary given by mistake) are refused with one line naming the file. `regular_only`: for a path
    that a file named (a run.json's job), not the user: a FIFO or device is refused without blocking."""
    p = Path(path)
    shown = printable(p)  # the path as the user typed it, control characters as \xNN
    if regular_only:  # looked at before it is opened: opening a device can act (a watchdog arms on open)
        try:
            if not stat.S_ISREG(os.stat(p).st_mode):
                raise UsageError(f"cannot read {what} {shown}: not a regular file (a FIFO, socket or device)")
        except OSError as exc:
            raise UsageError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    try:  # O_NONBLOCK: opening a FIFO nobody writes to would wait for ever (checked again on what was opened)
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | (os.O_NONBLOCK if regular_only else 0))
    except OSError as exc:
        raise UsageError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"cannot read {what} {shown}: it is a directory, not a file")
        if regular_only and not stat.S_ISREG(st.st_mode):
            raise UsageError(f"cannot read {what} {shown}: not a regular file (a FIFO, socket or device)")
        if stat.S_ISREG(st.st_mode) and st.st_size > limit:
            raise UsageError(f"{what} {shown} is {st.st_size:,} bytes, more than the {limit // 2**20} MiB "
                             f"a {what} may have: is it the right file?")
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise UsageError(f"{what} {shown} is more than the {limit // 2**20} MiB a {what} may have: is it the right file?")
    try:
        return data.decode("utf-8-sig")  # a BOM from a Windows editor is not content
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {shown} is not a text file (byte {exc.start:,} is not UTF-8): "
                         f"is it the right file?") from None
