"""trainready.data against hostile inputs: a forged index.json, forged shards, and a neighbour on
the node who plants files, symlinks or directories where the shard cache will look."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import fsspec
import numpy as np
import pytest
from run_helpers import env_for_run

from trainready.data import cache as cache_mod
from trainready.data import dataset as dataset_mod
from trainready.data.cache import CorruptShardError, ShardCache
from trainready.data.dataset import ShardedDataset
from trainready.data.format import EXT, INDEX, add_member, decode, iter_members, sample_key, shard_name
from trainready.data.index_io import ShardBuilder, load_index
from trainready.data.pack import pack
from trainready.dist import Identity
from trainready.errors import UsageError

LOCAL = fsspec.filesystem("file")
MEMORY = fsspec.filesystem("memory")
TEXTS = [f"document {i} ".encode() * (3 + i % 7) for i in range(60)]


# ---- helpers ---------------------------------------------------------------------------------

def packed(root: Path) -> Path:
    """A real dataset (`trainready data pack`): 60 text samples in several shards."""
    src = root / "src"
    src.mkdir(parents=True)
    for i, text in enumerate(TEXTS):
        (src / f"{i:03d}.txt").write_bytes(text)
    pack(src, str(root / "ds"), "text", 400)
    return root / "ds"


def in_memory(local: Path, name: str) -> str:
    """The dataset copied to fsspec's memory filesystem: a remote store, so reads go through the cache."""
    for path in sorted(local.rglob("*")):
        if path.is_file():
            MEMORY.pipe_file(f"/{name}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return f"memory://{name}"


def read_all(ds: ShardedDataset) -> list[bytes]:
    out = [sample["data"] for sample in ds]
    ds.close()
    return out


def edit_index(root: Path, edit) -> None:
    index = json.loads((root / INDEX).read_text())
    edit(index)
    (root / INDEX).write_text(json.dumps(index))


def untouched(path: Path, content: bytes) -> None:
    assert path.read_bytes() == content


@pytest.fixture
def ds(tmp_path) -> Path:
    return packed(tmp_path)


@pytest.fixture
def remote(ds, tmp_path) -> str:
    url = in_memory(ds, f"ds-{tmp_path.name}")
    yield url
    MEMORY.rm(url.removeprefix("memory://"), recursive=True)


# ---- 1. where the cache lives, and whose it must be -----------------------------------------

def test_default_cache_is_private_and_under_xdg_cache_home(remote, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ds = ShardedDataset(remote, rank=0, world_size=1, shuffle=False, decode=False)
    assert Path(ds.cache_dir) == tmp_path / "xdg" / "trainready" / "shards"
    assert read_all(ds) == TEXTS
    mode = os.stat(ds.cache_dir).st_mode & 0o777
    assert mode == 0o700 and ds.cache_stats["misses"] >= 1
    assert {p.name for p in Path(ds.cache_dir).glob("*.tar")} == {f"{s.sha256}.tar" for s in ds.index.shards}


def test_default_cache_falls_back_to_home_and_ignores_a_relative_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: ignored
    assert cache_mod.default_cache_dir() == tmp_path / "home" / ".cache" / "trainready" / "shards"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_mod.cache_directory(None) == tmp_path / "home" / ".cache" / "trainready" / "shards"


def test_a_planted_default_cache_is_refused(remote, tmp_path, monkeypatch):
    """A neighbour who prepared the cache directory (a symlink to theirs, or an open one) is refused."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chmod(theirs, 0o777)
    (tmp_path / "xdg" / "trainready").mkdir(parents=True)
    (tmp_path / "xdg" / "trainready" / "shards").symlink_to(theirs)
    with pytest.raises(UsageError, match="shards is not a directory"):
        ShardedDataset(remote, rank=0, world_size=1)
    assert list(theirs.iterdir()) == []


@pytest.mark.parametrize("case", ["symlink", "group-writable", "world-writable", "someone else's"])
def test_an_explicit_cache_dir_must_be_yours_alone(remote, tmp_path, case):
    target = tmp_path / "cache"
    if case == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "real")
        words = "is not a directory"
    elif case == "someone else's":
        if os.getuid() != 0:
            pytest.skip("needs root to give a directory to another user")
        target.mkdir(mode=0o700)
        os.chown(target, 65534, 65534)
        words = "belongs to uid 65534"
    else:
        target.mkdir()
        os.chmod(target, 0o770 if case == "group-writable" else 0o703)
        words = "is writable by others"
    with pytest.raises(UsageError, match=words):
        ShardedDataset(remote, rank=0, world_size=1, cache_dir=target)
    with pytest.raises(UsageError, match=words):
        ShardCache(target, 1 << 20)


def test_a_symlinked_locks_directory_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (cache / ".locks").symlink_to(elsewhere)
    with pytest.raises(UsageError, match=r"\.locks is not a directory"):
        ShardCache(cache, 1 << 20)
    assert list(elsewhere.iterdir()) == []


def test_a_local_dataset_creates_no_cache(ds, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert read_all(ShardedDataset(ds, rank=0, world_size=1, shuffle=False, decode=False)) == TEXTS
    assert not (tmp_path / "xdg").exists()


# ---- 2. lock and temp files never followed through a symlink ---------------------------------

def blob_item(root: Path, data: bytes = b"shard bytes " * 300) -> tuple[str, str, int, str]:
    path = root / "remote" / "shard-000000.tar"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path), shard_name(0), len(data), hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("which", ["shard lock", "cache lock"])
def test_a_symlink_at_a_lock_path_is_not_followed(tmp_path, which):
    item = blob_item(tmp_path)
    cache = ShardCache(tmp_path / "cache", 1 << 20)
    lock = cache.dir / ".locks" / f"{item[3]}.lock" if which == "shard lock" else cache.dir / ".cache.lock"
    victim, dangling = tmp_path / "victim.txt", tmp_path / "would-be-created"
    victim.write_bytes(b"precious")
    for target in (victim, dangling):  # an existing file, and one O_CREAT would create through the link
        lock.unlink(missing_ok=True)
        lock.symlink_to(target)
        with pytest.raises(UsageError, match=f"cannot lock {lock}"):
            cache.get(LOCAL, *item)
    untouched(victim, b"precious")
    assert not dangling.exists()
    assert not cache.path_for(item[3]).exists()


def test_a_symlink_planted_at_the_download_name_is_never_written_through(tmp_path, monkeypatch):
    """The download's temp name is predictable (sha, pid, thread): planted after our clean-up of
    leftovers, a symlink there would have the shard written into its target."""
    item = blob_item(tmp_path)
    cache = ShardCache(tmp_path / "cache", 1 << 20)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    scan = ShardCache._scan

    def plant_then_scan(self):
        tmp = self.dir / f".tmp-{item[3]}-{os.getpid()}-{threading.get_ident()}"
        if not tmp.is_symlink():
            tmp.symlink_to(victim)
        return scan(self)

    monkeypatch.setattr(ShardCache, "_scan", plant_then_scan)
    with pytest.raises(UsageError, match="appeared while downloading"):
        cache.get(LOCAL, *item)
    untouched(victim, b"precious")
    monkeypatch.setattr(ShardCache, "_scan", scan)
    assert cache.get(LOCAL, *item).read_bytes() == Path(item[0]).read_bytes()  # the leftover link is cleaned up
    untouched(victim, b"precious")


def test_a_symlink_planted_at_the_packers_temp_name_is_not_written_through(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.txt").write_bytes(b"x" * 100)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    shards = tmp_path / "ds" / "shards"
    shards.mkdir(parents=True)
    (shards / ".shard-000000.tar.tmp").symlink_to(victim)
    pack(src, str(tmp_path / "ds"), "text", 1 << 20)
    untouched(victim, b"precious")
    index, _, _ = load_index(str(tmp_path / "ds"))
    shard = shards / "shard-000000.tar"
    assert not shard.is_symlink() and hashlib.sha256(shard.read_bytes()).hexdigest() == index.shards[0].sha256


# ---- 3. a cached shard is verified before its first use in each process ----------------------

def test_a_tampered_cached_shard_is_never_read(remote, tmp_path, caplog):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    probe = ShardedDataset(remote, rank=0, world_size=1, cache_dir=cache)
    shard = probe.index.shards[0]
    forged = bytearray(MEMORY.cat_file(f"{remote.removeprefix('memory://')}/{shard.name}"))
    at = forged.index(b"document 0 ")
    forged[at:at + 11] = b"FORGED BYTE"  # same size, same name (the sha256), another sample
    path = cache / f"{shard.sha256}.tar"
    path.write_bytes(bytes(forged))
    os.chmod(path, 0o600)
    ds = ShardedDataset(remote, rank=0, world_size=1, shuffle=False, decode=False, cache_dir=cache)
    got = read_all(ds)
    assert got == TEXTS and not any(b"FORGED" in sample for sample in got)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == shard.sha256  # replaced by the true shard
    assert "does not match" in caplog.text and shard.name in caplog.text


@pytest.mark.parametrize("plant", ["shorter", "symlink", "fifo", "directory", "world-writable"])
def test_whatever_sits_at_a_cached_name_is_replaced_or_refused(tmp_path, plant):
    item = blob_item(tmp_path)
    cache = ShardCache(tmp_path / "cache", 1 << 20)
    path = cache.path_for(item[3])
    outside = tmp_path / "outside.tar"
    outside.write_bytes(Path(item[0]).read_bytes())  # the right bytes: still not to be trusted through a link
    if plant == "shorter":
        path.write_bytes(b"short")
    elif plant == "symlink":
        path.symlink_to(outside)
    elif plant == "fifo":
        os.mkfifo(path)
    elif plant == "directory":
        path.mkdir()
    else:
        path.write_bytes(Path(item[0]).read_bytes())
        os.chmod(path, 0o666)
    if plant == "directory":
        with pytest.raises(UsageError, match="cannot be removed"):
            cache.get(LOCAL, *item)
        return
    with cache.open(LOCAL, *item) as handle:
        assert handle.read() == Path(item[0]).read_bytes()
    assert path.is_file() and not path.is_symlink() and os.stat(path).st_mode & 0o777 == 0o600
    assert cache.stats.misses == 1 and outside.read_bytes() == Path(item[0]).read_bytes()


def test_verified_once_per_process_and_inode(tmp_path, monkeypatch):
    item = blob_item(tmp_path)
    first = ShardCache(tmp_path / "cache", 1 << 20)
    first.get(LOCAL, *item)  # downloaded (and so verified) by "another process"
    calls = []
    real = cache_mod.verify_file

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache_mod, "verify_file", counting)
    reader = ShardCache(tmp_path / "cache", 1 << 20)
    for _ in range(3):
        with reader.open(LOCAL, *item) as handle:
            assert handle.read() == Path(item[0]).read_bytes()
    assert len(calls) == 1 and reader.stats.hits == 3
    path = reader.path_for(item[3])
    copy = path.with_name("copy")
    copy.write_bytes(path.read_bytes())
    os.chmod(copy, 0o600)
    os.replace(copy, path)  # another file at the name (another inode): checked again
    reader.get(LOCAL, *item)
    assert len(calls) == 2
    reader._verified = (-1, reader._verified[1])  # as a forked DataLoader worker sees it: another process
    reader.get(LOCAL, *item)
    assert len(calls) == 3


def test_a_bad_sha256_never_becomes_a_cache_path(tmp_path):
    item = blob_item(tmp_path)
    cache = ShardCache(tmp_path / "cache", 1 << 20)
    for bad in ("../../escaped", "A" * 64, "0" * 63, "g" * 64):
        with pytest.raises(UsageError, match="is not 64 lowercase hex digits"):
            cache.get(LOCAL, item[0], item[1], item[2], bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "remote"]
    assert list((cache.dir / ".locks").iterdir()) == []


# ---- 4. index.json is checked field by field -------------------------------------------------

def shard_field(i: int, key: str, value):
    def edit(index):
        index["shards"][i][key] = value
    return edit


BAD_INDEXES = {
    "dotdot name": (shard_field(0, "name", "../outside.tar"), "shards.0.name = '../outside.tar'"),
    "nested dotdot": (shard_field(1, "name", "shards/../../outside.tar"), "shards.1.name"),
    "absolute name": (shard_field(1, "name", "/etc/passwd"), "shards.1.name = '/etc/passwd'"),
    "not a shard name": (shard_field(2, "name", "other/shard-000002.tar"), "shards.2.name"),
    "duplicate name": (shard_field(1, "name", shard_name(0)), "shards.1.name = 'shards/shard-000000.tar': listed twice"),
    "path as sha256": (shard_field(0, "sha256", "../../etc/passwd"), "shards.0.sha256"),
    "uppercase sha256": (shard_field(0, "sha256", "A" * 64), "shards.0.sha256"),
    "short sha256": (shard_field(1, "sha256", "0" * 63), "shards.1.sha256"),
    "negative samples": (shard_field(1, "samples", -1), "shards.1.samples = -1"),
    "negative bytes": (shard_field(0, "bytes", -5), "shards.0.bytes = -5"),
    "negative tokens": (shard_field(0, "tokens", -1), "shards.0.tokens = -1"),
    "string count": (shard_field(0, "samples", "3"), "shards.0.samples = '3'"),
    "float count": (shard_field(0, "bytes", 1.5), "shards.0.bytes = 1.5"),
    "negative first_sample": (shard_field(0, "first_sample", -1), "shards.0.first_sample = -1"),
    "inconsistent first_sample": (shard_field(2, "first_sample", 0), "shards.2.first_sample = 0: the shards before it hold"),
    "negative source_end": (shard_field(0, "source_end", {"file": -1, "record": 0}), "shards.0.source_end.file = -1"),
    "zero shard_size_bytes": (lambda index: index.update(shard_size_bytes=0), "shard_size_bytes = 0"),
}


@pytest.mark.parametrize("case", list(BAD_INDEXES))
def test_a_forged_index_is_a_usage_error_naming_the_field_and_the_file(ds, case):
    edit, words = BAD_INDEXES[case]
    (ds.parent / "outside.tar").write_bytes((ds / shard_name(0)).read_bytes())
    edit_index(ds, edit)
    for call in (lambda: load_index(str(ds)), lambda: ShardedDataset(ds, rank=0, world_size=1)):
        with pytest.raises(UsageError) as err:
            call()
        message = str(err.value)
        assert words in message and f"{ds}/{INDEX}" in message and "\n" not in message, message


def test_a_forged_shard_name_never_reads_outside_the_dataset(ds, tmp_path):
    """`../outside.tar` with the outside file's own sha256: it would verify, so only the name check stops it."""
    outside = ds.parent / "outside.tar"
    outside.write_bytes((ds / shard_name(0)).read_bytes())
    os.rename(ds / shard_name(0), ds / "moved.tar")
    edit_index(ds, shard_field(0, "name", "../outside.tar"))
    with pytest.raises(UsageError, match=r"shards\.0\.name"):
        read_all(ShardedDataset(ds, rank=0, world_size=1, decode=False))


def test_a_local_shard_that_is_not_a_regular_file_is_corrupt_not_a_hang(ds):
    """A directory or an endless device (/dev/zero) in a shard's place: a ShardError (skippable), not an
    IsADirectoryError, and never a read that does not end."""
    index, _, _ = load_index(str(ds))
    (ds / shard_name(1)).unlink()
    (ds / shard_name(1)).mkdir()
    with pytest.raises(CorruptShardError, match="is not a regular file"):
        read_all(ShardedDataset(ds, rank=0, world_size=1, decode=False))
    (ds / shard_name(1)).rmdir()
    (ds / shard_name(1)).symlink_to("/dev/zero")
    for verify in (True, False):
        with pytest.raises(CorruptShardError, match="is not a regular file"):
            read_all(ShardedDataset(ds, rank=0, world_size=1, decode=False, verify_local=verify))
    skipped = ShardedDataset(ds, rank=0, world_size=1, decode=False, shuffle=False, on_corrupt="skip")
    bad = index.shards[1]
    assert read_all(skipped) == TEXTS[:bad.first_sample] + TEXTS[bad.first_sample + bad.samples:]


def test_the_cli_reports_a_forged_index_without_a_traceback(ds):
    edit_index(ds, shard_field(3, "name", "../../etc/passwd"))
    proc = subprocess.run([sys.executable, "-m", "trainready", "data", "bench", str(ds), "--seconds", "1", "--json"],
                          capture_output=True, text=True, env=env_for_run(), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "shards.3.name" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    assert json.loads(proc.stdout)["error"]["exit_code"] == 2


# ---- hostile shard contents ------------------------------------------------------------------

def sparse_tar(claimed: int) -> bytes:
    """A tar whose first member is 10 bytes on disk but claims `claimed` bytes (a GNU sparse file)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(f"{sample_key(0)}.{EXT['text']}")
        info.size = 10
        info.pax_headers = {"GNU.sparse.map": "0,10", "GNU.sparse.size": str(claimed)}
        tar.addfile(info, io.BytesIO(b"0123456789"))
    return buffer.getvalue()


def test_a_sparse_member_cannot_expand_into_memory():
    with pytest.raises(tarfile.TarError, match="sparse"):
        list(iter_members(io.BytesIO(sparse_tar(256 << 20))))


def test_a_sparse_shard_is_reported_as_corrupt(tmp_path):
    root = tmp_path / "ds"
    (root / "shards").mkdir(parents=True)
    data = sparse_tar(256 << 20)
    (root / shard_name(0)).write_bytes(data)
    index = {"format": "text", "tokens_counted_as": "bytes", "shard_size_bytes": 1 << 20, "complete": True,
             "source": {"path": "src", "files": 1, "fingerprint": "0" * 64},
             "shards": [{"name": shard_name(0), "samples": 1, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                         "tokens": 10, "first_sample": 0, "source_end": {"file": 0, "record": 1}}]}
    (root / INDEX).write_text(json.dumps(index))
    with pytest.raises(CorruptShardError, match="sparse"):
        read_all(ShardedDataset(root, rank=0, world_size=1, decode=False))


def test_a_token_sample_cannot_claim_more_memory_than_it_holds():
    buffer = io.BytesIO()
    np.save(buffer, np.arange(4, dtype=np.uint16), allow_pickle=False)
    assert decode("tokens", buffer.getvalue()).tolist() == [0, 1, 2, 3]
    forged = io.BytesIO()  # np.load would allocate the 2 TB the header claims before reading 8 bytes
    np.lib.format.write_array_header_1_0(forged, {"descr": "<u2", "fortran_order": False, "shape": (10**12,)})
    with pytest.raises(ValueError, match="header claims shape"):
        decode("tokens", forged.getvalue() + b"\0" * 8)


# ---- 5. the shared I/O layer -----------------------------------------------------------------

def test_shards_uploaded_to_s3_are_proven_by_sha256(tmp_path, s3_bucket):
    import boto3

    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"{i:02d}.txt").write_bytes(os.urandom(200))
    url = f"s3://{s3_bucket}/ds"
    pack(src, url, "text", 2000)
    index, _, _ = load_index(url)
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"])
    assert len(index.shards) > 1
    for shard in index.shards:
        head = client.head_object(Bucket=s3_bucket, Key=f"ds/{shard.name}", ChecksumMode="ENABLED")
        assert head.get("ChecksumSHA256") == base64.b64encode(bytes.fromhex(shard.sha256)).decode(), shard.name


def test_the_data_layer_uses_the_shared_io_helpers(tmp_path):
    import trainready.io as tio
    from trainready.data import index_io

    assert not hasattr(index_io, "_HashingWriter") and not hasattr(cache_mod, "_mismatch")
    assert cache_mod.verify_file is tio.verify_file
    builder = ShardBuilder(tmp_path / "shard.tmp", 0, 0)
    assert isinstance(builder.out, tio.HashingWriter)
    add_member(builder.tar, f"{sample_key(0)}.txt", b"hello")
    info = builder.close()
    data = (tmp_path / "shard.tmp").read_bytes()
    assert (info.bytes, info.sha256) == (len(data), hashlib.sha256(data).hexdigest())


def test_a_corrupt_download_says_where_index_json_disagrees(tmp_path):
    path, name, size, sha = blob_item(tmp_path)
    with pytest.raises(CorruptShardError, match="sha256 .* where index.json says"):
        ShardCache(tmp_path / "cache", 1 << 20).get(LOCAL, path, name, size, "0" * 64)


def test_rank_and_world_come_from_dist_identity(ds, monkeypatch):
    monkeypatch.setattr(dataset_mod, "identity", lambda: Identity(rank=2, world_size=3))
    got = ShardedDataset(ds)
    assert (got.rank, got.world_size) == (2, 3)
    assert (ShardedDataset(ds, rank=0).rank, ShardedDataset(ds, world_size=4).world_size) == (0, 4)
    monkeypatch.setattr(dataset_mod, "identity", lambda: Identity(rank=5, world_size=3))
    with pytest.raises(UsageError, match="rank 5 is not in 0..2"):
        ShardedDataset(ds)
