"""The packed dataset format: WebDataset-style tar shards plus an index.

Why tar: it is the WebDataset convention (the `webdataset` library, torchdata, NVIDIA DALI and
`tar tf` all read it), it streams front to back without a seek, and a shard is one object in
S3, so one GET fetches thousands of samples. Members are written with fixed metadata (mtime 0,
uid/gid 0, mode 0644) so the same samples always make the same bytes.

Layout under the dataset URL:
    index.json                  written after every committed shard (the commit point)
    shards/shard-000000.tar     samples as members `{key}.{ext}`, key = 12-digit global ordinal

One sample per member: `.txt` (a text file's bytes), `.json` (one JSONL line), `.npy` (a 1-D
NumPy array of token ids, uint16 or uint32). A shard not listed in index.json does not exist
for readers (an interrupted pack leaves at most one such shard, overwritten on resume).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

INDEX = "index.json"
SHARD_DIR = "shards"
INDEX_SCHEMA_VERSION = 1
Format = Literal["text", "jsonl", "tokens"]
EXT = {"text": "txt", "jsonl": "json", "tokens": "npy"}


def shard_name(number: int) -> str:
    return f"{SHARD_DIR}/shard-{number:06d}.tar"


def sample_key(ordinal: int) -> str:
    return f"{ordinal:012d}"


class SourcePosition(BaseModel):
    """Where in the sorted source listing packing stopped: file index, record within the file."""

    model_config = ConfigDict(extra="forbid")
    file: int
    record: int


class ShardInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="path relative to the dataset URL")
    samples: int
    bytes: int
    sha256: str
    tokens: int = Field(description="tokens in the shard (bytes for text/jsonl: see tokens_counted_as)")
    first_sample: int = Field(description="global ordinal of the shard's first sample")
    source_end: SourcePosition = Field(description="source position after the shard's last sample (resume point)")


class SourceInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    files: int
    fingerprint: str = Field(description="sha256 over the sorted (relative path, size, mtime_ns) of every source file")


class DataIndex(BaseModel):
    """index.json of a packed dataset."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = INDEX_SCHEMA_VERSION
    kind: Literal["trainready-data-index"] = "trainready-data-index"
    format: Format
    token_dtype: Literal["uint16", "uint32"] | None = None
    tokens_counted_as: Literal["tokens", "bytes"]
    shard_size_bytes: int
    source: SourceInfo
    shards: list[ShardInfo] = []
    complete: bool = False

    @property
    def total_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o644, 0, 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def iter_members(fileobj: IO[bytes]) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every regular member, streaming (no seek). Raises tarfile.TarError on damage."""
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            handle = tar.extractfile(member)
            yield member.name, handle.read() if handle else b""


def decode(fmt: Format, data: bytes) -> Any:
    """A sample's bytes as the training loop wants them: str, dict, or a NumPy array of token ids."""
    if fmt == "text":
        return data.decode("utf-8", errors="replace")
    if fmt == "jsonl":
        import json

        return json.loads(data)
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)
