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
import re
import tarfile
from collections.abc import Iterator
from typing import IO, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainready.errors import pydantic_message
from trainready.io import confine, parse_json

INDEX = "index.json"
SHARD_DIR = "shards"
INDEX_SCHEMA_VERSION = 1
Format = Literal["text", "jsonl", "tokens"]
EXT = {"text": "txt", "jsonl": "json", "tokens": "npy"}
SHA256 = r"^[0-9a-f]{64}$"  # becomes part of a cache path: nothing but what hashlib writes
SHARD_NAME = rf"^{SHARD_DIR}/shard-[0-9]{{6,}}\.tar$"
# strict: a count in index.json is a JSON integer, not "3", 3.0 or true
Count = Annotated[int, Field(ge=0, strict=True)]


def shard_name(number: int) -> str:
    return f"{SHARD_DIR}/shard-{number:06d}.tar"


def sample_key(ordinal: int) -> str:
    return f"{ordinal:012d}"


class IndexFieldError(ValueError):
    """A check across fields that names the one it is about (pydantic would name only the list).
    Also built from one message (how torch re-raises a worker's error, and how pickle rebuilds
    one): then `loc` is () and `value` None."""

    def __init__(self, loc: tuple[str | int, ...] | str, value: Any = None, message: str | None = None):
        if message is None and isinstance(loc, str):
            from .errors import worker_message

            loc, message = (), worker_message(loc, type(self).__name__)[0]
        super().__init__(message)
        self.loc, self.value = loc, value


class SourcePosition(BaseModel):
    """Where in the sorted source listing packing stopped: file index, record within the file."""

    model_config = ConfigDict(extra="forbid")
    file: Count
    record: Count


class ShardInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="path relative to the dataset URL, as the packer writes it",
                      json_schema_extra={"pattern": SHARD_NAME})
    samples: Count
    bytes: Count
    sha256: str = Field(pattern=SHA256)
    tokens: Count = Field(description="tokens in the shard (bytes for text/jsonl: see tokens_counted_as)")
    first_sample: Count = Field(description="global ordinal of the shard's first sample: the samples of the shards before it")
    source_end: SourcePosition = Field(description="source position after the shard's last sample (resume point)")

    @field_validator("name")
    @classmethod
    def _confined(cls, name: str) -> str:
        # a name read from someone else's index must not reach outside the dataset root
        try:
            confine(name, "name")
        except ValueError:
            raise ValueError("escapes the dataset's directory (absolute, '..', empty or odd parts)") from None
        if not re.fullmatch(SHARD_NAME, name):
            raise ValueError(f"is not {SHARD_DIR}/shard-NNNNNN.tar (what `trainready data pack` writes)")
        return name


class SourceInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    files: Count
    fingerprint: str = Field(pattern=SHA256,
                             description="sha256 over the sorted (relative path, size, mtime_ns) of every source file")


class DataIndex(BaseModel):
    """index.json of a packed dataset."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = INDEX_SCHEMA_VERSION
    kind: Literal["trainready-data-index"] = "trainready-data-index"
    format: Format
    token_dtype: Literal["uint16", "uint32"] | None = None
    tokens_counted_as: Literal["tokens", "bytes"]
    shard_size_bytes: int = Field(ge=1, strict=True)
    source: SourceInfo
    shards: list[ShardInfo] = []
    complete: bool = False

    @field_validator("shards")
    @classmethod
    def _consistent(cls, shards: list[ShardInfo]) -> list[ShardInfo]:
        """Sample ordinals run on from shard to shard, and no shard is listed twice."""
        total, names = 0, set()
        for i, shard in enumerate(shards):
            if shard.first_sample != total:
                raise IndexFieldError(("shards", i, "first_sample"), shard.first_sample,
                                      f"the shards before it hold {total} samples, so it must be {total}")
            if shard.name in names:
                raise IndexFieldError(("shards", i, "name"), shard.name, "listed twice")
            total += shard.samples
            names.add(shard.name)
        return shards

    @property
    def total_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)


def index_problem(exc: ValidationError) -> str:
    """The first thing wrong with an index, in one line: the field's path, its value, why."""
    first = exc.errors()[0]
    loc, value, why = first["loc"], first.get("input"), pydantic_message(first["msg"])
    cause = first.get("ctx", {}).get("error")
    if first["type"] == "string_pattern_mismatch" and first["ctx"].get("pattern") == SHA256:
        why = "must be a sha256: 64 lowercase hex digits"
    if isinstance(cause, IndexFieldError):
        loc, value = cause.loc, cause.value
    where = ".".join(str(p) for p in loc) or "(top level)"
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"{where} = {shown}: {why}" if not isinstance(value, (dict, list)) else f"{where}: {why}"


def _member_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o644, 0, 0
    info.uname = info.gname = ""
    return info


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    tar.addfile(_member_info(name, len(data)), io.BytesIO(data))


def member_bytes(tar: tarfile.TarFile, name: str, size: int) -> int:
    """Bytes a member adds to a shard: its header (512, more if PAX needs extended records) and its
    data padded to 512-byte blocks."""
    if size < 8**11 and len(name) <= 100 and name.isascii():  # fits a plain ustar header (every name we write)
        header = tarfile.BLOCKSIZE
    else:
        header = len(_member_info(name, size).tobuf(tar.format, tar.encoding, tar.errors))
    return header + -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def tar_file_size(members_bytes: int) -> int:
    """A shard's file size from its members' bytes: tarfile ends an archive with two zero blocks
    and pads it to a whole record (10 KiB)."""
    return -(-(members_bytes + 2 * tarfile.BLOCKSIZE) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def iter_members(fileobj: IO[bytes]) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every regular member, streaming (no seek). Raises tarfile.TarError on damage.
    Sparse members are refused: a few bytes of one can claim terabytes of holes to read."""
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            if member.sparse is not None:
                raise tarfile.TarError(f"member {member.name} is a sparse file (claims {member.size} bytes)")
            handle = tar.extractfile(member)
            yield member.name, handle.read() if handle else b""


def decode(fmt: Format, data: bytes) -> Any:
    """A sample's bytes as the training loop wants them: str, dict, or a NumPy array of token ids."""
    if fmt == "text":
        return data.decode("utf-8", errors="replace")
    if fmt == "jsonl":
        return parse_json(data)
    return _load_tokens(data)


def _load_tokens(data: bytes) -> Any:
    """np.load, after checking that the header's shape fits the bytes: np.load allocates what the
    header claims before reading, so a forged shape would ask for any amount of memory."""
    import numpy as np

    buffer = io.BytesIO(data)
    version = np.lib.format.read_magic(buffer)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f"a .npy sample of format version {version}: samples are written as version 1.0 or 2.0")
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(buffer)
    claimed = dtype.itemsize
    for n in shape:
        claimed *= n
    if claimed != len(data) - buffer.tell():
        raise ValueError(f"a .npy sample whose header claims shape {shape} of {dtype} ({claimed} bytes) "
                         f"but holds {len(data) - buffer.tell()} bytes")
    buffer.seek(0)
    return np.load(buffer, allow_pickle=False)
