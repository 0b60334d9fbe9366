"""What every check receives: the bundle and what we know the node should be."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainready.catalog.schema import Gpu, Instance
from trainready.io import parse_json

from .bundle import Bundle


@dataclass
class JobNeeds:
    """What a planned job needs from the node (from --job/--model); None: unknown."""

    host_ram_gib: float | None = None
    checkpoint_gib: float | None = None
    keep_checkpoints: int = 2
    description: str = ""


@dataclass
class Context:
    bundle: Bundle
    instance: Instance | None
    gpu: Gpu | None
    job: JobNeeds | None = None
    live: bool = False
    cpu_only: bool = False  # the user says this node has no GPU (--cpu-only): no GPU is then no failure
    instance_note: str = ""  # why the bundle's instance-type.txt was not taken (refused, not a name)
    mig_expected: bool = False  # --mig: MIG mode is intended (else MIG on fails gpu.mig)
    _parsed: dict[str, Any] = field(default_factory=dict, repr=False)

    def parsed(self, name: str, parser: Callable[[str], Any]) -> Any:
        """`parser(file text)`, parsed once per analysis (several checks read the same file); None if absent."""
        if name not in self._parsed:
            text = self.bundle.text(name)
            self._parsed[name] = None if text is None else parser(text)
        return self._parsed[name]

    def deep(self, key: str) -> dict | None:
        """One section of deep.json; None without --deep results, {"error": ...} if unreadable."""
        data = self.parsed("deep.json", _json_or_error)
        if data is None:
            return None
        return data.get(key) if "error" not in data else data

    @property
    def gpu_count(self) -> int | None:
        return self.instance.gpu_count if self.instance else None

    def expect(self, text: str) -> str:
        if self.instance:
            return text
        return f"unknown ({self.instance_note}; pass --instance TYPE)" if self.instance_note else "unknown (pass --instance TYPE)"

    @property
    def unknown_instance(self) -> str:
        """'instance type unknown', with why when the bundle named one we could not take."""
        return f"instance type unknown ({self.instance_note})" if self.instance_note else "instance type unknown"


def _json_or_error(text: str) -> dict:
    try:
        data = parse_json(text)
    except (ValueError, RecursionError):
        return {"error": f"deep.json unparsable: {text[:80]!r}"}
    return data if isinstance(data, dict) else {"error": "deep.json is not an object"}
