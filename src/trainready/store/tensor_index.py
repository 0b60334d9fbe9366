"""Our own tensor index (`tensors.json`): where every tensor chunk of a checkpoint lives, as JSON.

DCP keeps the same facts in `.metadata`, a pickle. We still write that file (so other tools
that read DCP checkpoints can), but we never read it when a `tensors.json` is there: restore
gives DCP metadata built from this validated JSON. Checkpoints written before the JSON index
existed are read through `legacy_index`, which decodes `.metadata` with the data-only pickle
reader and an exact list of the classes DCP puts there.

Validation is complete: every name is a plain file name in the checkpoint directory, every
chunk lies inside its tensor, every storage entry points at a chunk of a listed tensor, every
number is a non-negative int, every dtype is one of DTYPE_NAMES. Byte items (pickled objects DCP
loads with torch.load) do not exist in this format.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainready.io import parse_json

from . import pickle_data
from .pickle_data import Call, Global, Obj

TENSOR_INDEX_JSON = "tensors.json"
DCP_METADATA = ".metadata"
SCHEMA_VERSION = 1
MAX_DIMS = 32
MAX_NUMEL = 1 << 50
# dtype names a checkpoint may hold (torch attribute names; no torch needed to validate)
DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
               "float8_e5m2fnuz", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
               "complex64", "complex128")


@functools.cache
def torch_dtypes() -> dict[str, Any]:
    """DTYPE_NAMES -> torch.dtype, for those this torch has (looked up by our names, never a file's)."""
    import torch

    return {name: getattr(torch, name) for name in DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)}
_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class TensorIndexError(ValueError):
    """The tensor index is malformed or refers to something it must not."""


def _dims(values: list[int], what: str) -> list[int]:
    if len(values) > MAX_DIMS or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise ValueError(f"{what} must be at most {MAX_DIMS} non-negative ints, got {values!r}")
    return values


class Chunk(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    offsets: list[int]
    sizes: list[int]

    @field_validator("offsets", "sizes")
    @classmethod
    def _check(cls, value: list[int]) -> list[int]:
        return _dims(value, "chunk offsets/sizes")


class TensorEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    dtype: str
    size: list[int]
    requires_grad: bool = False
    chunks: list[Chunk]

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        if value not in DTYPE_NAMES:
            raise ValueError(f"dtype {value!r} is not one of {', '.join(DTYPE_NAMES)}")
        return value

    @field_validator("size")
    @classmethod
    def _size(cls, value: list[int]) -> list[int]:
        _dims(value, "size")
        if math.prod(value) > MAX_NUMEL:
            raise ValueError(f"size {value} has more than {MAX_NUMEL} elements")
        return value

    @model_validator(mode="after")
    def _chunks_inside(self) -> TensorEntry:
        for chunk in self.chunks:
            if len(chunk.offsets) != len(self.size) or len(chunk.sizes) != len(self.size):
                raise ValueError(f"chunk {chunk.offsets}+{chunk.sizes} does not match size {self.size}")
            if any(o + s > d for o, s, d in zip(chunk.offsets, chunk.sizes, self.size, strict=True)):
                raise ValueError(f"chunk {chunk.offsets}+{chunk.sizes} lies outside size {self.size}")
        return self


class StorageEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    fqn: str
    offset: list[int]
    index: int | None = None
    file: str = Field(description="A file in the checkpoint directory (no path).")
    at: int = Field(ge=0)
    length: int = Field(ge=0)

    @field_validator("file")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _FILE.match(value) or value in (".", "..") or value.startswith(".") or value == TENSOR_INDEX_JSON:
            raise ValueError(f"file {value!r} is not a data file name of this checkpoint")
        return value

    @field_validator("offset")
    @classmethod
    def _offset(cls, value: list[int]) -> list[int]:
        return _dims(value, "offset")


class TensorIndex(BaseModel):
    """tensors.json. Schema: docs/schemas/ckpt-tensor-index.schema.json."""

    model_config = ConfigDict(extra="forbid", strict=True)
    schema_version: int = SCHEMA_VERSION
    kind: str = "trainready.tensor-index"
    dcp_version: str | None = None
    tensors: dict[str, TensorEntry]
    storage: list[StorageEntry]

    @model_validator(mode="after")
    def _storage_points_at_chunks(self) -> TensorIndex:
        if self.schema_version != SCHEMA_VERSION or self.kind != "trainready.tensor-index":
            raise ValueError(f"not a tensor index this trainready reads (kind {self.kind!r}, "
                             f"schema_version {self.schema_version})")
        chunks = {fqn: {tuple(c.offsets) for c in t.chunks} for fqn, t in self.tensors.items()}
        seen = set()
        for entry in self.storage:
            if entry.fqn not in chunks:
                raise ValueError(f"storage entry for {entry.fqn!r}, which is not in tensors")
            key = (entry.fqn, tuple(entry.offset))
            if key[1] not in chunks[entry.fqn]:
                raise ValueError(f"storage entry for {entry.fqn!r} at {entry.offset} matches none of its chunks")
            if key in seen:
                raise ValueError(f"two storage entries for {entry.fqn!r} at {entry.offset}")
            seen.add(key)
        return self

    # ---- JSON --------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        return (self.model_dump_json() + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> TensorIndex:
        try:
            raw = parse_json(data)
        except ValueError as exc:
            raise TensorIndexError(f"not JSON: {exc}") from None
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top level)"
            raise TensorIndexError(f"{where}: {first['msg']}") from None

    def files(self) -> set[str]:
        return {e.file for e in self.storage}

    def shapes(self) -> dict[str, tuple[Any, Any]]:
        """fqn -> (torch.Size, torch.dtype)."""
        import torch

        dtypes = torch_dtypes()
        return {k: (torch.Size(t.size), _known(dtypes, t.dtype)) for k, t in self.tensors.items()}

    # ---- DCP metadata --------------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Any) -> TensorIndex:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        tensors = {}
        for fqn, item in metadata.state_dict_metadata.items():
            if not isinstance(item, TensorStorageMetadata):
                raise TensorIndexError(f"{fqn!r} is not a tensor; trainready checkpoints hold tensors only")
            tensors[fqn] = TensorEntry(
                dtype=str(item.properties.dtype).removeprefix("torch."), size=list(item.size),
                requires_grad=bool(item.properties.requires_grad),
                chunks=[Chunk(offsets=list(c.offsets), sizes=list(c.sizes)) for c in item.chunks])
        storage = [StorageEntry(fqn=index.fqn, offset=list(index.offset or ()), index=index.index,
                                file=info.relative_path, at=info.offset, length=info.length)
                   for index, info in metadata.storage_data.items()]
        if any(getattr(info, "transform_descriptors", None) for info in metadata.storage_data.values()):
            raise TensorIndexError("DCP stream transforms are not supported")
        return cls(dcp_version=getattr(metadata, "version", None), tensors=tensors, storage=storage)

    def to_metadata(self, storage_meta: Any = None) -> Any:
        """DCP's Metadata for this index (built here from validated values; nothing unpickled)."""
        import torch
        from torch.distributed.checkpoint.filesystem import _StorageInfo
        from torch.distributed.checkpoint.metadata import (
            ChunkStorageMetadata,
            Metadata,
            MetadataIndex,
            TensorProperties,
            TensorStorageMetadata,
        )

        sd_meta = {
            fqn: TensorStorageMetadata(
                properties=TensorProperties(dtype=_known(torch_dtypes(), t.dtype), requires_grad=t.requires_grad),
                size=torch.Size(t.size),
                chunks=[ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes)) for c in t.chunks])
            for fqn, t in self.tensors.items()}
        storage = {MetadataIndex(e.fqn, e.offset, e.index): _StorageInfo(e.file, e.at, e.length) for e in self.storage}
        return Metadata(state_dict_metadata=sd_meta, planner_data={k: (k,) for k in self.tensors},
                        storage_data=storage, storage_meta=storage_meta, version=self.dcp_version)


# ---- checkpoints written before tensors.json: .metadata read as data -------------------------

_MD = "torch.distributed.checkpoint.metadata"
_LEGACY_GLOBALS = frozenset(
    {(_MD, n) for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")}
    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
       ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
       ("collections", "OrderedDict"), ("torch", "contiguous_format"), ("torch", "strided")}
    | {("torch", name) for name in DTYPE_NAMES})


def legacy_index(data: bytes) -> TensorIndex:
    """The index of a DCP `.metadata` pickle, decoded as data (see pickle_data) and matched exactly.
    Every value is checked for its type before it is used, and the items converted are bounded by
    the file's size: shared references (the memo) cannot expand a small file into a huge index."""
    budget = [len(data)]
    try:
        root = pickle_data.load(data, _LEGACY_GLOBALS)
        md = _state(root, "Metadata", dict)
        tensors = {}
        for fqn, item in _dict(md.get("state_dict_metadata")).items():
            if isinstance(item, Obj) and str(item.cls) == f"{_MD}.BytesStorageMetadata":
                raise TensorIndexError(f"{fqn!r} is a pickled byte item; trainready never writes them and will not load them")
            tm = _state(item, "TensorStorageMetadata", dict)
            dtype, requires_grad = _properties(tm.get("properties"))
            chunks = _list(tm.get("chunks"))
            _spend(budget, len(chunks))
            tensors[_str(fqn)] = {"dtype": dtype, "size": _size(tm.get("size"), budget), "requires_grad": requires_grad,
                                  "chunks": [_chunk(c, budget) for c in chunks]}
        storage = []
        for key, info in _dict(md.get("storage_data")).items():
            _spend(budget, 1)
            index, sinfo = _state(key, "MetadataIndex", dict), _state(info, "_StorageInfo", dict)
            if sinfo.get("transform_descriptors"):
                raise TensorIndexError("DCP stream transforms are not supported")
            offset = index.get("offset")
            storage.append({"fqn": _str(index.get("fqn")), "offset": [] if offset is None else _size(offset, budget),
                            "index": _int(index.get("index"), optional=True), "file": _str(sinfo.get("relative_path")),
                            "at": _int(sinfo.get("offset")), "length": _int(sinfo.get("length"))})
        version = md.get("version")
    except pickle_data.PickleDataError as exc:
        raise TensorIndexError(str(exc)) from None
    except (TypeError, ValueError, RecursionError) as exc:  # shapes the checks above did not foresee
        raise TensorIndexError(f"malformed: {type(exc).__name__}: {str(exc)[:200]}") from None
    return TensorIndex.from_bytes(json.dumps({"dcp_version": version if isinstance(version, str) else None,
                                              "tensors": tensors, "storage": storage}).encode())


def _spend(budget: list[int], items: int) -> None:
    budget[0] -= items
    if budget[0] < 0:
        raise TensorIndexError("refers to more items than the file could hold (shared references expanded)")


def _int(value: Any, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 62:
        raise TensorIndexError(f"expected a non-negative int, found {type(value).__name__}")
    return value


def _known(dtypes: dict[str, Any], name: str) -> Any:
    if name not in dtypes:
        raise TensorIndexError(f"dtype {name} is not supported by this torch")
    return dtypes[name]


def _state(value: Any, cls_name: str, kind: type) -> Any:
    if not isinstance(value, Obj) or value.args or not value.built or not str(value.cls).endswith(f".{cls_name}"):
        raise TensorIndexError(f"expected a {cls_name}, found {type(value).__name__}")
    if cls_name == "_StorageInfo" and value.cls.module != "torch.distributed.checkpoint.filesystem":
        raise TensorIndexError("unexpected _StorageInfo class")
    if not isinstance(value.state, kind):
        raise TensorIndexError(f"{cls_name} with a state of type {type(value.state).__name__}")
    return value.state


def _dict(value: Any) -> dict:
    if not isinstance(value, dict):
        raise TensorIndexError(f"expected a dict, found {type(value).__name__}")
    return value


def _list(value: Any) -> list:
    if not isinstance(value, list):
        raise TensorIndexError(f"expected a list, found {type(value).__name__}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TensorIndexError(f"expected a string, found {type(value).__name__}")
    return value


def _size(value: Any, budget: list[int]) -> list[int]:
    if (isinstance(value, Call) and value.func == Global("torch", "Size") and len(value.args) == 1
            and isinstance(value.args[0], tuple) and len(value.args[0]) <= MAX_DIMS):
        _spend(budget, len(value.args[0]))
        return [_int(v) for v in value.args[0]]
    raise TensorIndexError("expected a torch.Size")


def _chunk(value: Any, budget: list[int]) -> dict[str, list[int]]:
    state = _state(value, "ChunkStorageMetadata", dict)
    return {"offsets": _size(state.get("offsets"), budget), "sizes": _size(state.get("sizes"), budget)}


def _properties(value: Any) -> tuple[str, bool]:
    if not isinstance(value, Obj) or str(value.cls) != f"{_MD}.TensorProperties" or value.args:
        raise TensorIndexError("expected TensorProperties")
    state = value.state
    if isinstance(state, tuple) and len(state) == 5:  # (dtype, layout, requires_grad, memory format, pin_memory)
        dtype, requires_grad = state[0], state[2]
    elif isinstance(state, dict):
        dtype, requires_grad = state.get("dtype"), state.get("requires_grad", False)
    else:
        raise TensorIndexError("TensorProperties with an unexpected state")
    if not isinstance(dtype, Global) or dtype.module != "torch" or dtype.name not in DTYPE_NAMES:
        raise TensorIndexError(f"unsupported dtype {dtype}")
    if not isinstance(requires_grad, bool):
        raise TensorIndexError("requires_grad is not a bool")
    return dtype.name, requires_grad
