"""`pack`: a source tree of text, JSONL or token files into tar shards plus index.json, resumably.

Order is deterministic (files sorted by relative POSIX path, records in file order), so a source
position (file index, record) names exactly where packing stopped. A shard goes live before the
index lists it, and the index is rewritten after every shard: a pack killed at any moment resumes
after the last listed shard, overwriting the one unlisted shard it may have left, and ends with
the same bytes an uninterrupted pack writes."""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from trainready.errors import UsageError
from trainready.io import parse_json, redact
from trainready.store.faults import fault_point

from .format import EXT, DataIndex, Format, SourceInfo, SourcePosition, sample_key, shard_name, tar_file_size
from .index_io import (
    ShardBuilder,
    check_local_path,
    clear_dataset,
    is_local,
    open_dataset,
    put_shard,
    read_index,
    shard_temp_path,
    write_index,
)

SUFFIXES = {"jsonl": (".jsonl", ".json"), "tokens": (".npy",)}
TOKEN_DTYPES = ("uint16", "uint32")
MMAP_OVER = 64 << 20  # .npy files bigger than this are memory-mapped, not read whole
SMALL_SHARD = 1 << 20  # below this --shard-size gets a warning: per-object request overhead dominates reading
# a shard is one object: 5 TiB is S3's largest ("Maximum object size: 5 TiB", Amazon S3 multipart upload limits,
# docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html; AWS has since raised it, MinIO and most other S3 stores not)
MAX_SHARD = 5 << 40
Progress = Callable[[int, int], None]  # (source bytes done, source bytes total)


class PackResult(BaseModel):
    schema_version: int = 1
    kind: Literal["trainready-data-pack"] = "trainready-data-pack"
    url: str
    format: Format
    status: Literal["packed", "resumed", "already packed"]
    shards_written: int
    shards_total: int
    samples_total: int
    bytes_total: int
    tokens_total: int
    tokens_counted_as: Literal["tokens", "bytes"]
    token_dtype: Literal["uint16", "uint32"] | None = None
    resumed_from_shard: int | None = None
    skipped_files: int = 0
    skipped_examples: list[str] = []
    notes: list[str] = []
    seconds: float


@dataclass
class SourceFile:
    rel: str
    path: Path
    size: int
    mtime_ns: int


@dataclass
class Sample:
    payload: bytes
    tokens: int
    end: SourcePosition  # position just after this sample: the resume point if it ends a shard
    source_done: int     # source bytes consumed so far (for progress)


def _unreadable(exc: OSError) -> None:
    raise UsageError(f"cannot read {exc.filename}: {exc.strerror}")  # os.walk would skip it and lose data silently


def list_sources(src: Path, fmt: Format) -> tuple[list[SourceFile], list[str]]:
    """The files to pack, sorted by relative POSIX path, and the relative paths of those skipped
    because their suffix does not match the format. Hidden files and directories are ignored."""
    check_local_path(src, f"SRC {src}")
    if not src.exists():
        raise UsageError(f"SRC {src} does not exist")
    if src.is_file():
        if fmt == "text":
            raise UsageError(f"SRC {src} is a file; --format text packs a directory (one file = one sample). "
                             "Pass the directory, or --format jsonl / tokens to pack this one file")
        found, whole_dir = [(src.name, src)], False
    elif src.is_dir():
        found, whole_dir = [], True
        for dirpath, dirnames, filenames in os.walk(src, onerror=_unreadable):  # symlinked dirs not followed: no loops
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                path = Path(dirpath) / name
                if not name.startswith(".") and path.is_file():
                    found.append((path.relative_to(src).as_posix(), path))
    else:
        raise UsageError(f"SRC {src} is neither a file nor a directory")
    files, skipped = [], []
    for rel, path in sorted(found):
        if fmt != "text" and whole_dir and not rel.lower().endswith(SUFFIXES[fmt]):  # a file named alone is packed
            skipped.append(rel)
            continue
        stat = path.stat()
        files.append(SourceFile(rel, path, stat.st_size, stat.st_mtime_ns))
    if not files:
        wanted = "files" if fmt == "text" else "/".join(f"*{s}" for s in SUFFIXES[fmt]) + " files"
        extra = f" (skipped {len(skipped)} other files, e.g. {', '.join(skipped[:3])})" if skipped else ""
        raise UsageError(f"SRC {src} has no {wanted} to pack as --format {fmt}{extra}")
    return files, skipped


def fingerprint(files: list[SourceFile]) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.rel}\0{f.size}\0{f.mtime_ns}\n".encode())
    return digest.hexdigest()


def _npy_header(f: SourceFile) -> tuple[tuple[int, ...], Any]:
    import numpy as np

    try:
        with open(f.path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{f.path}: not a readable .npy file ({exc})") from None
    return shape, dtype


def check_token_files(files: list[SourceFile]) -> str:
    """The one token dtype every .npy file shares; checked from headers before anything is written."""
    first: tuple[str, str] | None = None
    for f in files:
        shape, dtype = _npy_header(f)
        if dtype.name not in TOKEN_DTYPES:
            raise UsageError(f"{f.path}: dtype {dtype} is not a token id type; save token ids as uint16 "
                             "(vocabularies up to 65536) or uint32")
        if len(shape) not in (1, 2):
            raise UsageError(f"{f.path}: a {len(shape)}-D array; token files are 1-D (one sample) or 2-D (one sample per row)")
        if first is None:
            first = (f.rel, dtype.name)
        elif dtype.name != first[1]:
            raise UsageError(f"{f.path}: dtype {dtype.name}, but {first[0]} is {first[1]}; every token file must share one dtype")
    return first[1] if first else "uint16"


def _text_records(f: SourceFile, skip: int) -> Iterator[tuple[int, bytes, int, int]]:
    # every reader yields (record number, sample bytes, tokens, source bytes of the file consumed)
    if skip == 0:
        data = f.path.read_bytes()
        yield 0, data, len(data), f.size


def _jsonl_records(f: SourceFile, skip: int) -> Iterator[tuple[int, bytes, int, int]]:
    record = offset = 0
    with open(f.path, "rb") as handle:
        for lineno, line in enumerate(handle, 1):
            offset += len(line)
            body = line.rstrip(b"\r\n")
            if lineno == 1 and body.startswith(b"\xef\xbb\xbf"):  # a UTF-8 BOM is not part of the first record
                body = body[3:]
            if not body.strip():
                continue
            if record >= skip:
                try:
                    parse_json(body)
                except ValueError as exc:
                    raise UsageError(f"{f.path}:{lineno}: not valid JSON ({exc}). Every non-empty line must be one JSON "
                                     "value (JSON Lines; a pretty-printed .json file is not). Fix the line, then pack "
                                     "again with --restart") from None
                yield record, body, len(body), offset
            record += 1


def _token_records(f: SourceFile, skip: int) -> Iterator[tuple[int, bytes, int, int]]:
    import numpy as np

    try:
        array = np.load(f.path, mmap_mode="r" if f.size > MMAP_OVER else None, allow_pickle=False)
    except ValueError as exc:
        raise UsageError(f"{f.path}: not a readable .npy file ({exc})") from None
    rows = array[None] if array.ndim == 1 else array
    little = rows.dtype.newbyteorder("<")  # one byte order in shards, whatever the source used
    for r in range(skip, len(rows)):
        row = np.ascontiguousarray(rows[r], dtype=little)
        buffer = io.BytesIO()
        np.save(buffer, row, allow_pickle=False)
        yield r, buffer.getvalue(), int(row.shape[0]), f.size * (r + 1) // len(rows)


READERS = {"text": _text_records, "jsonl": _jsonl_records, "tokens": _token_records}


def iter_samples(files: list[SourceFile], fmt: Format, start: SourcePosition) -> Iterator[Sample]:
    """Every sample from `start` on, in the one deterministic order."""
    done = sum(f.size for f in files[:start.file])
    for i in range(start.file, len(files)):
        f = files[i]
        try:
            for record, payload, tokens, offset in READERS[fmt](f, start.record if i == start.file else 0):
                yield Sample(payload, tokens, SourcePosition(file=i, record=record + 1), done + offset)
        except OSError as exc:
            raise UsageError(f"cannot read {f.path}: {exc.strerror or exc}") from None
        done += f.size


def shard_size_note(shard_size_bytes: int) -> str | None:
    """The warning for a --shard-size too small for object storage, or None."""
    if shard_size_bytes >= SMALL_SHARD:
        return None
    few = ("one shard per sample (a tar shard is at least 10 KiB)" if shard_size_bytes < tar_file_size(1)
           else "shards of a few samples")
    size = f"{shard_size_bytes:,} byte{'s' if shard_size_bytes != 1 else ''}"
    return (f"--shard-size {size} is under 1 MiB and makes {few}: every shard is one object to "
            "fetch, and per-object request overhead (~10-50 ms per GET on S3) then dominates reading; "
            "100 MiB to 1 GiB suits object storage")


def _needs_numpy() -> None:
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise UsageError("--format tokens needs numpy: pip install 'trainready[data]'") from None


def _resolve(path: Path, shown: str) -> Path:
    """path.resolve(), a UsageError naming it when it cannot be (Python 3.11 raises RuntimeError for a symlink loop)."""
    try:
        return path.resolve()
    except RuntimeError:
        raise UsageError(f"{shown}: a symlink loop (symbolic links that point at each other) on the way to it; "
                         "remove or fix the links, or choose another path") from None
    except OSError as exc:
        raise UsageError(f"{shown}: {exc.strerror or exc}") from None


def _check_resumable(index: DataIndex, source: SourceInfo, fmt: Format, shard_size: int, url: str) -> None:
    again = "use --restart to pack it again from scratch, or a new --out"
    if index.format != fmt:
        raise UsageError(f"{url} was packed as --format {index.format}, not {fmt}: {again}")
    if index.source.fingerprint != source.fingerprint:
        raise UsageError(f"SRC changed since packing started: use --restart or a new --out ({index.source.files} files "
                         f"then, {source.files} now, or their sizes or modification times differ)")
    if index.shard_size_bytes != shard_size:
        raise UsageError(f"{url} was packed with --shard-size {index.shard_size_bytes} bytes, not {shard_size}: {again}")


def pack(src: str | os.PathLike, out_url: str, fmt: Format, shard_size_bytes: int, progress: Progress | None = None,
         restart: bool = False) -> PackResult:
    """Pack SRC into the dataset at out_url, resuming an interrupted pack of the same SRC."""
    started = time.monotonic()
    url = redact(out_url)
    if shard_size_bytes < 1:
        raise UsageError(f"--shard-size must be at least 1 byte, got {shard_size_bytes}")
    if shard_size_bytes > MAX_SHARD:
        raise UsageError(f"--shard-size {shard_size_bytes:,} bytes is more than 5 TiB, the largest object S3 stores; "
                         "100 MiB to 1 GiB suits object storage")
    if fmt == "tokens":
        _needs_numpy()
    if not str(src).strip():  # Path("") would be the current directory
        raise UsageError("SRC is empty: give the directory (or .jsonl/.npy file) to pack; . is the current directory")
    fs, root = open_dataset(out_url)  # a location that cannot be one fails before SRC is read
    src = Path(src)
    files, skipped = list_sources(src, fmt)
    token_dtype = check_token_files(files) if fmt == "tokens" else None
    source = SourceInfo(path=str(_resolve(src, f"SRC {src}")), files=len(files), fingerprint=fingerprint(files))
    if is_local(fs) and src.is_dir() and _resolve(Path(root), f"--out {url}").is_relative_to(_resolve(src, f"SRC {src}")):
        raise UsageError(f"--out {out_url} is inside SRC {src}: packing would read its own shards; put --out elsewhere")
    index = read_index(fs, root, url)
    if index is not None and restart:
        clear_dataset(fs, root, url)
        index = None
    elif index is not None:
        _check_resumable(index, source, fmt, shard_size_bytes, url)
    resumed_from = None if index is None or index.complete else len(index.shards)
    already = index is not None and index.complete
    if index is None:  # committed first with no shards: fails early on an unwritable --out
        index = DataIndex(format=fmt, token_dtype=token_dtype, tokens_counted_as="tokens" if fmt == "tokens" else "bytes",
                          shard_size_bytes=shard_size_bytes, source=source)
        write_index(fs, root, index, url)
    written = 0 if already else _write_shards(fs, root, url, index, files, progress)
    small = shard_size_note(index.shard_size_bytes) if written else None
    notes = [small] if small else []
    notes += [f"every file is a {other} file but --format is text (one file = one sample): did you mean --format {other}?"
             for other, suffixes in SUFFIXES.items() if fmt == "text" and all(f.rel.lower().endswith(suffixes) for f in files)]
    status = "already packed" if already else "resumed" if resumed_from is not None else "packed"
    return PackResult(url=url, format=fmt, status=status, shards_written=written, shards_total=len(index.shards),
                      samples_total=index.total_samples, bytes_total=index.total_bytes, tokens_total=index.total_tokens,
                      tokens_counted_as=index.tokens_counted_as, token_dtype=index.token_dtype, resumed_from_shard=resumed_from,
                      skipped_files=len(skipped), skipped_examples=skipped[:5], notes=notes,
                      seconds=round(time.monotonic() - started, 3))


def _write_shards(fs: Any, root: str, url: str, index: DataIndex, files: list[SourceFile], progress: Progress | None) -> int:
    """Shards from where the index stops to the end of the source, each committed as it is done."""
    start = index.shards[-1].source_end if index.shards else SourcePosition(file=0, record=0)
    number, ordinal, written = len(index.shards), index.total_samples, 0
    total, ext, last_report = sum(f.size for f in files), EXT[index.format], 0.0

    def commit(builder: ShardBuilder, last: bool) -> None:
        info = builder.close()
        put_shard(fs, root, builder.path, info.name, info.bytes, info.sha256, url)
        fault_point("data.shard_uploaded")
        index.shards.append(info)
        index.complete = last
        write_index(fs, root, index, url)
        fault_point("data.index_written")

    builder: ShardBuilder | None = None
    with tempfile.TemporaryDirectory(prefix="trainready-pack-") as scratch:
        try:
            for sample in iter_samples(files, index.format, start):
                member = f"{sample_key(ordinal)}.{ext}"
                if builder is not None and builder.file_size_with(member, len(sample.payload)) > index.shard_size_bytes:
                    commit(builder, last=False)
                    number, written, builder = number + 1, written + 1, None
                if builder is None:
                    path = shard_temp_path(fs, root, shard_name(number), Path(scratch))
                    builder = ShardBuilder(path, number, ordinal)
                builder.add(member, sample.payload, sample.tokens, sample.end)
                ordinal += 1
                if progress is not None and time.monotonic() - last_report > 0.1:
                    progress(sample.source_done, total)
                    last_report = time.monotonic()
            if builder is not None:
                commit(builder, last=True)
                written, builder = written + 1, None
        finally:
            if builder is not None:  # an error mid-shard: drop the partial local file
                builder.discard()
    if not index.shards:
        raise UsageError(f"SRC {index.source.path} has no samples (every file is empty)")
    if progress is not None:
        progress(total, total)
    return written
