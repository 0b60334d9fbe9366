"""Read one tensor record of a DCP data file without torch.load.

DCP writes each tensor chunk with `torch.save`: a small zip archive holding `data.pkl` (a pickle
that says "rebuild a tensor from storage <key> with this dtype, offset, size and stride"),
`byteorder` and `data/<key>` (the raw bytes). torch.load would run that pickle; here it is
decoded by the data-only reader and matched against the only two shapes torch.save gives a
plain tensor (`_rebuild_tensor_v2` with a typed storage, `_rebuild_tensor_v3` with an untyped
storage and a dtype). The raw bytes are then viewed as the tensor, after checking that the
view stays inside them. Anything else is refused.
"""

from __future__ import annotations

import ctypes
import math
import struct
import zipfile
from typing import IO, Any

import torch

from . import pickle_data
from .pickle_data import Call, Global, PersistentId
from .tensor_index import torch_dtypes

DTYPES = torch_dtypes()

MAX_PICKLE_BYTES = 1 << 20
_STORAGE_DTYPES = {name: dtype for dtype, name in torch.storage._dtype_to_storage_type_map().items()
                   if dtype in DTYPES.values()}
_ALLOWED = frozenset({("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor_v3"),
                      ("collections", "OrderedDict"), ("torch.storage", "UntypedStorage")}
                     | {("torch", name) for name in _STORAGE_DTYPES} | {("torch", name) for name in DTYPES})


class RecordError(ValueError):
    """A tensor record that is not what torch.save writes for a plain tensor."""


def read_record(stream: IO[bytes]) -> torch.Tensor:
    """The tensor stored in `stream` (a seekable view of exactly one record)."""
    try:
        archive = zipfile.ZipFile(stream)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise RecordError(f"not a tensor record ({exc})") from None
    with archive:
        names = archive.namelist()
        prefix = names[0].split("/", 1)[0] if names else ""
        pkl = _member(archive, f"{prefix}/data.pkl", MAX_PICKLE_BYTES)
        order = _member(archive, f"{prefix}/byteorder", 16, optional=True)
        if order not in (None, b"little"):
            raise RecordError(f"byte order {order!r} is not supported")
        try:
            tree = pickle_data.load(archive.read(pkl), _ALLOWED, persistent_ids=True)
        except pickle_data.PickleDataError as exc:
            raise RecordError(f"tensor record: {exc}") from None
        key, dtype, numel, offset, size, stride = _describe(tree)
        data = _member(archive, f"{prefix}/data/{key}", numel * _itemsize(dtype))
        if data.file_size != numel * _itemsize(dtype):
            raise RecordError(f"storage {key} holds {data.file_size} bytes, expected {numel * _itemsize(dtype)}")
        raw = torch.empty(data.file_size, dtype=torch.uint8)
        # read the stored bytes straight into the tensor's memory (zipfile would copy them twice
        # and CRC them; a bytearray would be zeroed first)
        stream.seek(_data_start(stream, data))
        if data.file_size and stream.readinto(_writable(raw)) != data.file_size:
            raise RecordError(f"storage {key} is truncated")
    flat = raw.view(dtype) if numel else torch.empty(0, dtype=dtype)
    _check_view(numel, offset, size, stride)
    return flat.as_strided(size, stride, offset)


def _member(archive: zipfile.ZipFile, name: str, limit: int, optional: bool = False) -> Any:
    try:
        info = archive.getinfo(name)
    except KeyError:
        if optional:
            return None
        raise RecordError(f"tensor record has no {name}") from None
    if info.compress_type != zipfile.ZIP_STORED or info.file_size > limit:
        raise RecordError(f"{name} is compressed or larger than {limit} bytes")
    if optional:
        return archive.read(info)
    return info


_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # a zip local file header (zipfile.structFileHeader)


def _data_start(stream: IO[bytes], info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes begin: after its local header, name and extra field."""
    stream.seek(info.header_offset)
    raw = stream.read(_LOCAL_HEADER.size)
    if len(raw) != _LOCAL_HEADER.size:
        raise RecordError(f"{info.filename}: truncated local header")
    fields = _LOCAL_HEADER.unpack(raw)
    if fields[0] != b"PK\x03\x04":
        raise RecordError(f"{info.filename}: bad local header")
    return info.header_offset + _LOCAL_HEADER.size + fields[10] + fields[11]


def _writable(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory."""
    return memoryview((ctypes.c_char * tensor.numel()).from_address(tensor.data_ptr())).cast("B")


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in value):
        raise RecordError(f"{what} is not a tuple of non-negative ints")
    return value


def _describe(tree: Any) -> tuple[str, torch.dtype, int, int, tuple[int, ...], tuple[int, ...]]:
    """(storage key, dtype, storage elements, offset, size, stride) of a rebuild record."""
    if not isinstance(tree, Call) or tree.func.module != "torch._utils":
        raise RecordError("tensor record does not rebuild a tensor")
    args = tree.args
    v3 = tree.func.name == "_rebuild_tensor_v3"
    if len(args) < (7 if v3 else 6):
        raise RecordError("tensor record has too few arguments")
    pid, offset, size, stride, requires_grad, hooks = args[:6]
    if not isinstance(pid, PersistentId) or not isinstance(pid.value, tuple) or len(pid.value) != 5:
        raise RecordError("tensor record's storage reference is malformed")
    tag, storage_cls, key, location, count = pid.value
    if tag != "storage" or not isinstance(key, str) or not key.isdigit() or not isinstance(count, int) or count < 0:
        raise RecordError("tensor record's storage reference is malformed")
    if not isinstance(location, str) or not isinstance(offset, int) or offset < 0 or not isinstance(requires_grad, bool):
        raise RecordError("tensor record's arguments are malformed")
    if not (isinstance(hooks, Call) and hooks.func == Global("collections", "OrderedDict") and not hooks.args):
        raise RecordError("tensor record carries backward hooks")
    if v3:
        dtype_ref = args[6]
        if storage_cls != Global("torch.storage", "UntypedStorage") or not isinstance(dtype_ref, Global) \
                or dtype_ref.module != "torch" or dtype_ref.name not in DTYPES:
            raise RecordError("tensor record's dtype is not supported")
        dtype = DTYPES[dtype_ref.name]
        itemsize = _itemsize(dtype)
        if count % itemsize:
            raise RecordError("untyped storage size is not a whole number of elements")
        count //= itemsize
    else:
        if not isinstance(storage_cls, Global) or storage_cls.module != "torch" or storage_cls.name not in _STORAGE_DTYPES:
            raise RecordError(f"storage type {storage_cls} is not supported")
        dtype = _STORAGE_DTYPES[storage_cls.name]
    size, stride = _ints(size, "size"), _ints(stride, "stride")
    if len(size) != len(stride) or len(size) > 32:
        raise RecordError("size and stride do not match")
    return key, dtype, count, offset, size, stride


def _check_view(numel: int, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
    if any(s == 0 for s in size):
        return
    if math.prod(size) > numel:  # DCP stores each chunk in a storage of its own size: no stride-0 expansion
        raise RecordError(f"tensor of size {size} from a storage of {numel} elements (expanded view)")
    last = offset + sum((s - 1) * st for s, st in zip(size, stride, strict=True))
    if last >= numel:
        raise RecordError(f"tensor view (offset {offset}, size {size}, stride {stride}) reaches past its {numel} elements")
