"""The one I/O layer every subsystem (store, data, run, check) uses: URLs, durable writes,
hash-while-write, verification, private modes and redaction of secrets. It imports nothing
from the rest of trainready but `errors`, so any layer may use it."""

from .files import (
    CHUNK,
    HashingWriter,
    PreconditionFailed,
    child_umask,
    confine,
    create_exclusive,
    dir_mode,
    file_mode,
    fsync_dir,
    fsync_file,
    hash_stream,
    local_tag,
    make_dir,
    mismatch,
    open_nofollow,
    owned_private_dir,
    parse_json,
    put_if_local,
    read_regular,
    replace_durable,
    sha256_file,
    verify_file,
    write_synced,
)
from .redact import has_url_credentials, redact, redact_argv
from .urls import (
    S3_PART,
    IntegrityError,
    SourceChangedError,
    is_local,
    is_s3,
    open_url,
    protocols,
    put_if,
    read_versioned,
    stored_matches,
    upload_checked,
)

__all__ = [
    "CHUNK", "HashingWriter", "child_umask", "confine", "create_exclusive", "dir_mode", "file_mode", "fsync_dir",
    "fsync_file",
    "hash_stream", "local_tag", "make_dir", "mismatch", "open_nofollow", "owned_private_dir", "parse_json", "replace_durable", "sha256_file",
    "verify_file", "write_synced", "put_if_local", "read_regular", "redact", "redact_argv", "has_url_credentials", "S3_PART", "IntegrityError",
    "PreconditionFailed", "SourceChangedError", "is_local", "is_s3", "open_url", "protocols", "put_if",
    "read_versioned", "stored_matches", "upload_checked",
]
