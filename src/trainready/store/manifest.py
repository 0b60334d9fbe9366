"""The manifest: what a committed checkpoint holds, and the marker that it is committed.

A checkpoint is a directory `step-<12 digits>-g<4 digits>` (step, writer generation). It is
committed on a tier once `manifest.json` is in it: on the hot tier the directory is renamed
into place with the manifest already inside; on the archive the manifest is uploaded last.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainready.io import confine, parse_json

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
LEASE = "writer.json"
TMP_PREFIX = ".tmp-"
PARTS_DIR = ".parts"
MAX_GENERATION = 999_999_999  # g + up to 9 digits
_NAME = re.compile(r"^step-(\d{12})-g(\d{4,9})$")


def checkpoint_name(step: int, generation: int) -> str:
    return f"step-{step:012d}-g{generation:04d}"


def parse_name(name: str) -> tuple[int, int] | None:
    """(step, generation) of a checkpoint directory name, None for anything else."""
    match = _NAME.match(name)
    if not match:
        return None
    step, generation = int(match.group(1)), int(match.group(2))
    return (step, generation) if name == checkpoint_name(step, generation) else None  # one spelling per checkpoint


def confined(path: str) -> str:
    """A manifest path, checked to stay inside its checkpoint directory."""
    confine(path, "path")
    pure = PurePosixPath(path)
    if pure.name == MANIFEST or pure.parts[0] == PARTS_DIR:
        raise ValueError(f"path {path!r} is reserved")
    return path


class FileEntry(BaseModel):
    """One file of a checkpoint."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="Relative to the checkpoint directory; never absolute, never '..'.")
    size: int = Field(ge=0, description="Bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _confined(cls, value: str) -> str:
        return confined(value)


class Manifest(BaseModel):
    """Written last; its presence commits the checkpoint. Schema: docs/schemas/ckpt-manifest.schema.json."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    kind: str = "trainready.checkpoint"
    step: int = Field(ge=0)
    run_id: str = Field(min_length=1, max_length=128)
    generation: int = Field(ge=1, le=MAX_GENERATION, description="Writer generation; a newer writer fences older ones.")
    world_size: int = Field(ge=1)
    nodes: int = Field(ge=1)
    created_unix: float
    save_seconds: float = Field(ge=0, description="Wall time from the save call to the hot commit.")
    versions: dict[str, str]
    metadata: dict[str, Any] = Field(default_factory=dict, description="User metadata (JSON).")
    files: list[FileEntry] = Field(description="The checkpoint as the archive holds it (every rank's files).")
    node_files: dict[int, list[FileEntry]] = Field(
        description="What each node's hot tier holds (its ranks' files and its own tensor index).")

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def to_bytes(self) -> bytes:
        return (self.model_dump_json(indent=1) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        raw = parse_json(data)
        if not isinstance(raw, dict):
            raise ValueError(f"manifest is a JSON {type(raw).__name__}, not an object")
        if "schema_version" not in raw:
            raise ValueError(f"manifest has no schema_version (this trainready reads {SCHEMA_VERSION})")
        if raw["schema_version"] != SCHEMA_VERSION:
            raise ValueError(f"manifest schema_version {json.dumps(raw['schema_version'])}, this trainready reads "
                             f"{SCHEMA_VERSION}")
        return cls.model_validate(raw)


class Lease(BaseModel):
    """`writer.json` at a prefix's root: who may write there now, and what older writers may still
    have committed (anything they committed later was written after they lost the prefix)."""

    model_config = ConfigDict(extra="ignore")
    schema_version: int = SCHEMA_VERSION
    run_id: str = Field(min_length=1, max_length=128)
    generation: int = Field(ge=1, le=MAX_GENERATION)
    host: str = ""
    pid: int = 0
    started_unix: float = 0.0
    fenced: dict[int, int] | None = Field(None, description=(
        "Older generation -> newest step it had committed when this generation took over. A checkpoint "
        "of an older generation that is absent here or has a later step was committed by a fenced "
        "writer and is never restored. null: written before this was recorded (nothing known)."))

    def fences(self, step: int, generation: int) -> bool:
        """Whether a checkpoint (step, generation) was committed by a writer this lease fenced."""
        if self.fenced is None or generation >= self.generation:
            return False
        bound = self.fenced.get(generation)
        return bound is None or step > bound
