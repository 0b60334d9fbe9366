"""One place that writes to the terminal: Rich for people, plain JSON for programs."""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel
from rich.console import Console

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False)


def emit_json(data: BaseModel | dict[str, Any]) -> None:
    if isinstance(data, BaseModel):
        text = data.model_dump_json(indent=2)
    else:
        text = json.dumps(data, indent=2, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def error(message: str, *, as_json: bool, exit_code: int) -> None:
    # never wrapped: an error is copied, grepped and read in logs whole
    err.print("[bold red]error:[/] ", end="", markup=True, highlight=False)
    err.print(message, markup=False, highlight=False, soft_wrap=True)  # a message may quote anything: never markup
    if as_json:
        emit_json({"schema_version": 1, "error": {"message": message, "exit_code": exit_code}})
