"""One place that writes to the terminal: Rich for people, plain JSON for programs."""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.text import Text


class _Console(Console):
    def on_broken_pipe(self) -> None:
        raise BrokenPipeError  # `| head` closed our output: cli.main ends the process the Unix way


def make_console(**kwargs: Any) -> Console:
    """Every console we print through: markup off, so text a user, a file or a library wrote
    (`llama[/x]`, `[rank0]:`, botocore's `[/:]`) prints as written. Our own styles go through
    `styled`/`line`, never through `[tags]` in strings."""
    return _Console(markup=False, highlight=False, **kwargs)


def styled(text: object, style: str) -> Text:
    return Text(str(text), style=style)


def line(*parts: str | Text | tuple[str, str]) -> Text:
    """One line from plain strings, `styled` pieces and (text, style) pairs."""
    return Text.assemble(*parts)


out = make_console(soft_wrap=False)
err = make_console(stderr=True)


def emit_json(data: BaseModel | dict[str, Any]) -> None:
    if isinstance(data, BaseModel):
        text = data.model_dump_json(indent=2)
    else:
        text = json.dumps(data, indent=2, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def error(message: str, *, as_json: bool, exit_code: int) -> None:
    # never wrapped: an error is copied, grepped and read in logs whole
    err.print(line(("error:", "bold red"), " ", message), soft_wrap=True)
    if as_json:
        emit_json({"schema_version": 1, "error": {"message": message, "exit_code": exit_code}})
