"""Storage locations by URL (fsspec; s3fs for s3://): open, upload with proof, conditional writes.

Uploads are proven, not assumed: `upload_checked` sends the SHA-256 with every S3 PUT and part
(`ChecksumAlgorithm=SHA256`: S3 rejects a body that does not match it) and then reads back the
object's stored checksum (HeadObject with ChecksumMode=ENABLED). That works with every bucket
encryption (SSE-S3, SSE-KMS, SSE-C) and with multipart uploads, where an ETag is not an MD5. A
store that reports no checksum (some S3-compatible servers) is checked by size alone, and the
result says so ("size"), never "verified".

Conditional writes (the fencing of writer leases and checkpoint commits):
* S3: create-only is PutObject with If-None-Match: *, update-if-unchanged is If-Match: <ETag>.
* The local disk: create-only is a hard link of a finished temp file (atomic, fails if the name
  exists); update-if-unchanged compares the content under an flock on a side file, then renames.
  On NFS flock is advisory per client: two writers on different hosts are then only as safe as
  check-then-write.
* Other fsspec stores: check-then-write (documented; no atomicity).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from trainready.errors import TrainreadyError, UsageError

from .files import CHUNK, PreconditionFailed, file_mode, hash_stream, local_tag, make_dir, put_if_local, read_regular
from .redact import redact

S3_PART = 64 << 20  # S3 multipart part size (a part is held in memory while it is sent)
S3_MAX_PARTS = 10_000  # S3's limit per multipart upload (docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html)


def part_size_for(size: int, part_size: int = S3_PART) -> int:
    """`part_size`, grown in whole MiB when the file would need more than S3's 10,000 parts (a
    shard or checkpoint file over 625 GiB at 64 MiB); the same rule when a stored composite
    checksum is recomputed."""
    need = -(-size // S3_MAX_PARTS)
    return max(part_size, -(-need // (1 << 20)) << 20)


class IntegrityError(TrainreadyError):
    """An object, after upload, does not match the local file (retry the upload)."""


class SourceChangedError(TrainreadyError):
    """The local file no longer matches the checksum it was recorded with (retrying cannot help)."""


# ---- opening ---------------------------------------------------------------------------------

S3_SCHEMES = ("s3://", "s3a://")
BUCKET_RULE = ("S3 bucket names are 3-63 characters of lowercase letters, digits, dots and hyphens, starting and "
               "ending with a letter or digit")
_SENDABLE_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")  # what botocore sends at all (older buckets: A-Z and _)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def s3_bucket(url: str) -> str | None:
    """The bucket an s3:// (s3a://) URL names ('' when none); None for any other URL."""
    if not url.startswith(S3_SCHEMES):
        return None
    return url.split("://", 1)[1].split("/", 1)[0]


def validate_bucket(url: str) -> None:
    """A UsageError (exit 2, one line) for an s3:// URL without a bucket or with one no S3 request
    can name (botocore refuses it before sending, with a two-line dump of its regexes); nothing for
    other URLs. Names valid only for older us-east-1 buckets (capitals, underscores) pass: S3 says
    whether such a bucket exists; `bucket_name_problem` tells why a missing one never could."""
    bucket = s3_bucket(url)
    if bucket is None or bucket.startswith("arn:"):  # access point ARNs: botocore checks those itself
        return
    if not bucket:
        raise UsageError(f"{redact(url)}: no bucket in the URL (s3://BUCKET/prefix)")
    if not _SENDABLE_BUCKET.fullmatch(bucket):
        raise UsageError(f"{redact(url)}: invalid bucket name {_shown(bucket)}: {BUCKET_RULE}")


def bucket_name_problem(bucket: str) -> str:
    """Why `bucket` breaks today's S3 naming rule ('' when it keeps it): a hint for a bucket that
    was not found."""
    if _BUCKET.fullmatch(bucket) and ".." not in bucket and not re.fullmatch(r"[0-9.]+", bucket):
        return ""
    return f"{_shown(bucket)} is not a valid bucket name: {BUCKET_RULE}"


def _shown(name: str) -> str:
    """A name for a message: quoted, control characters escaped."""
    return repr(name)


def open_url(url: str) -> tuple[Any, str]:
    """fsspec filesystem + path for a URL; s3:// honours AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL
    and uses short timeouts (an unreachable endpoint fails in seconds, and botocore retries).
    An s3:// URL without a valid bucket name is a UsageError (`validate_bucket`)."""
    import fsspec.core

    options: dict[str, Any] = {}
    if url.startswith(S3_SCHEMES):
        validate_bucket(url)
        try:
            import s3fs  # noqa: F401
        except ImportError:
            raise UsageError("s3:// URLs need s3fs: pip install 'trainready[s3]'") from None
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options["client_kwargs"] = {"endpoint_url": endpoint}
        options["config_kwargs"] = {"connect_timeout": 5, "read_timeout": 30, "retries": {"max_attempts": 2}}
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"cannot open {redact(url)}: {redact(str(exc))}") from None
    return fs, path


def protocols(fs: Any) -> set[str]:
    proto = fs.protocol
    return set(proto if isinstance(proto, (tuple, list)) else (proto,)) | ({"file"} if "local" in str(proto) else set())


def is_local(fs: Any) -> bool:
    """Whether an fsspec filesystem is the local disk."""
    return "file" in protocols(fs)


def is_s3(fs: Any) -> bool:
    return bool({"s3", "s3a"} & protocols(fs))


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


# ---- proven uploads --------------------------------------------------------------------------

def upload_checked(fs: Any, local: str | os.PathLike, remote: str, sha256: str, size: int,
                   *, part_size: int = S3_PART) -> str:
    """Copy `local` to `remote` and prove the result: returns "sha256" (the stored object's
    checksum matches) or "size" (the store reports none: only the size could be checked).
    Raises SourceChangedError when the local file no longer matches `sha256`, IntegrityError when
    the stored object does not match what was sent."""
    local = Path(local)
    if is_local(fs):
        return _copy_local(local, Path(remote), sha256, size)
    if is_s3(fs):
        return _upload_s3(fs, local, remote, sha256, size, part_size)
    fs.put_file(str(local), remote)
    _invalidate(fs, remote)
    found = int(fs.info(remote).get("size") or 0)
    if found != size:
        raise IntegrityError(f"{redact(fs.unstrip_protocol(remote))} has {found} bytes after upload, expected {size}")
    return "size"


def _copy_local(local: Path, dest: Path, sha256: str, size: int) -> str:
    make_dir(dest.parent)
    digest, seen = hashlib.sha256(), 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
    with open(local, "rb") as src, os.fdopen(fd, "wb") as out:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            seen += len(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    if (seen, digest.hexdigest()) != (size, sha256):
        raise SourceChangedError(f"{local} changed since it was recorded ({seen} bytes, sha256 {digest.hexdigest()[:16]}...)")
    return "sha256"


def _upload_s3(fs: Any, local: Path, remote: str, sha256: str, size: int, part_size: int) -> str:
    bucket, key, _ = fs.split_path(remote)
    part_size = part_size_for(size, part_size)
    if size <= part_size:
        data = local.read_bytes()
        digest = hashlib.sha256(data).digest()
        if (len(data), digest.hex()) != (size, sha256):
            raise SourceChangedError(f"{local} changed since it was recorded")
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256",
                   ChecksumSHA256=_b64(digest))
        expected = _b64(digest)
    else:
        expected = _multipart_s3(fs, local, bucket, key, sha256, size, part_size)
    _invalidate(fs, remote)
    head = fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    where = redact(f"s3://{bucket}/{key}")
    if int(head.get("ContentLength", -1)) != size:
        raise IntegrityError(f"{where} has {head.get('ContentLength')} bytes after upload, expected {size}")
    stored = head.get("ChecksumSHA256")
    if not stored:
        return "size"
    if stored.split("-")[0] != expected.split("-")[0]:  # composite checksums may carry "-<parts>"
        raise IntegrityError(f"{where}: stored SHA-256 checksum {stored} does not match the uploaded file ({expected})")
    return "sha256"


def _multipart_s3(fs: Any, local: Path, bucket: str, key: str, sha256: str, size: int, part_size: int) -> str:
    """Multipart upload with a SHA-256 per part; returns the composite checksum S3 will report."""
    upload = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")
    parts, part_digests, whole, seen = [], [], hashlib.sha256(), 0
    try:
        with open(local, "rb") as handle:
            while chunk := handle.read(part_size):
                digest = hashlib.sha256(chunk).digest()
                whole.update(chunk)
                seen += len(chunk)
                out = fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                                 PartNumber=len(parts) + 1, Body=chunk, ChecksumAlgorithm="SHA256",
                                 ChecksumSHA256=_b64(digest))
                parts.append({"PartNumber": len(parts) + 1, "ETag": out["ETag"], "ChecksumSHA256": _b64(digest)})
                part_digests.append(digest)
        if (seen, whole.hexdigest()) != (size, sha256):
            raise SourceChangedError(f"{local} changed since it was recorded")
        fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                   MultipartUpload={"Parts": parts})
    except BaseException:
        with contextlib.suppress(Exception):
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload["UploadId"])
        raise
    return _b64(hashlib.sha256(b"".join(part_digests)).digest()) + f"-{len(parts)}"


def stored_matches(fs: Any, local: str | os.PathLike, remote: str, sha256: str, size: int,
                   *, part_size: int = S3_PART) -> bool:
    """Whether `remote` already holds exactly `local` (sha256/size as recorded), so an upload can
    be skipped (a retried or resumed upload). Proven by content, never by size alone: S3 by the
    stored SHA-256 checksum (composite ones recomputed from the local file), a local path by
    reading it; a store that proves nothing answers False (upload again)."""
    local = Path(local)
    try:
        if is_local(fs):
            with open(remote, "rb") as handle:
                return hash_stream(handle) == (sha256, size)
        if not is_s3(fs):
            return False
        bucket, key, _ = fs.split_path(remote)
        _invalidate(fs, remote)
        head = fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except FileNotFoundError:
        return False
    stored = head.get("ChecksumSHA256")
    if int(head.get("ContentLength", -1)) != size or not stored:
        return False
    if stored.split("-")[0] == _b64(bytes.fromhex(sha256)):
        return True
    digests, part_size = [], part_size_for(size, part_size)
    with open(local, "rb") as handle:
        while chunk := handle.read(part_size):
            digests.append(hashlib.sha256(chunk).digest())
    return stored.split("-")[0] == _b64(hashlib.sha256(b"".join(digests)).digest())


def _invalidate(fs: Any, path: str) -> None:
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)


# ---- conditional writes ----------------------------------------------------------------------

def _precondition(exc: BaseException) -> bool:
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    code = str(getattr(cause, "response", {}).get("Error", {}).get("Code", ""))
    return code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")


def read_versioned(fs: Any, path: str) -> tuple[bytes, str]:
    """(content, version tag) of an object; FileNotFoundError when absent. The tag is what
    `put_if` takes as `if_match`: the S3 ETag (s3fs reads the body with If-Match on it, so the two
    belong together), else a digest of the content."""
    _invalidate(fs, path)
    if is_s3(fs):
        with fs.open(path, "rb", cache_type="none") as handle:
            return handle.read(), str(handle.details.get("ETag", ""))
    if is_local(fs):
        tag = local_tag(path)
        if tag is None:
            raise FileNotFoundError(path)
        try:
            return read_regular(path, 1 << 26), tag
        except OSError:
            return b"", tag  # a directory or symlink in its place: no content, a tag to replace it by
    data = fs.cat_file(path)
    return data, hashlib.sha256(data).hexdigest()


def put_if(fs: Any, path: str, data: bytes, *, if_match: str | None = None, create_only: bool = False) -> None:
    """Write `data` to `path` only if it does not exist (`create_only`) or still has version tag
    `if_match`; PreconditionFailed otherwise. Neither given: an unconditional durable write."""
    if is_s3(fs):
        bucket, key, _ = fs.split_path(path)
        condition = {"IfNoneMatch": "*"} if create_only else ({"IfMatch": if_match} if if_match else {})
        try:
            fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256",
                       ChecksumSHA256=_b64(hashlib.sha256(data).digest()), **condition)
        except (OSError, FileExistsError) as exc:
            if isinstance(exc, FileExistsError) or _precondition(exc):
                raise PreconditionFailed(f"{redact(path)} changed under us") from None
            raise
        _invalidate(fs, path)
        return
    if is_local(fs):
        put_if_local(Path(path), data, if_match=if_match, create_only=create_only)
        return
    # other stores: check-then-write (not atomic; see the module docstring)
    if create_only or if_match:
        try:
            current = hashlib.sha256(fs.cat_file(path)).hexdigest()
        except FileNotFoundError:
            current = None
        if (create_only and current is not None) or (if_match and current != if_match):
            raise PreconditionFailed(f"{redact(path)} changed under us")
    fs.pipe_file(path, data)
    _invalidate(fs, path)
