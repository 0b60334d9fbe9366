"""What every check receives: the bundle and what we know the node should be."""

from __future__ import annotations

from dataclasses import dataclass

from trainready.catalog.schema import Gpu, Instance

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

    @property
    def gpu_count(self) -> int | None:
        return self.instance.gpu_count if self.instance else None

    def expect(self, text: str) -> str:
        return text if self.instance else "unknown (pass --instance TYPE)"
