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
    output_file,
    owned_private_dir,
    parse_json,
    put_if_local,
    read_regular,
    replace_durable,
    sha256_file,
    verify_file,
    write_synced,
    xdg_dir,
)
from .redact import has_url_credentials, is_secret_name, redact, redact_argv, redact_json
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
    "child_umask", "CHUNK", "confine", "create_exclusive", "dir_mode", "file_mode", "fsync_dir", "fsync_file",
    "has_url_credentials", "hash_stream", "HashingWriter", "IntegrityError", "is_local", "is_s3", "is_secret_name", "local_tag",
    "make_dir", "mismatch", "open_nofollow", "open_url", "output_file", "owned_private_dir", "parse_json", "PreconditionFailed",
    "protocols", "put_if", "put_if_local", "read_regular", "read_versioned", "redact", "redact_argv", "redact_json",
    "replace_durable", "S3_PART", "sha256_file", "SourceChangedError", "stored_matches", "upload_checked",
    "verify_file", "write_synced", "xdg_dir",
]
