"""ShardCache: verified downloads, LRU within a byte limit, and many processes sharing one directory."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest

from trainready.data.cache import CorruptShardError, MissingShardError, ShardCache, verify_file
from trainready.errors import UsageError

SRC = Path(__file__).resolve().parents[1] / "src"
SIZE = 4096


def make_remote(root: Path, count: int, size: int = SIZE) -> list[tuple[str, str, int, str]]:
    """`count` distinct blobs under root/shards; (remote_path, name, size, sha256) for each."""
    (root / "shards").mkdir(parents=True, exist_ok=True)
    items = []
    for i in range(count):
        data = hashlib.sha256(str(i).encode()).digest() * (size // 32)
        path = root / "shards" / f"shard-{i:06d}.tar"
        path.write_bytes(data)
        items.append((str(path), f"shards/shard-{i:06d}.tar", len(data), hashlib.sha256(data).hexdigest()))
    return items


def listing(cache: ShardCache) -> list[str]:
    return sorted(p.name for p in cache.dir.iterdir() if p.name != ".locks" and p.name != ".cache.lock")


LOCAL = fsspec.filesystem("file")


def test_get_downloads_once_then_hits(tmp_path):
    items = make_remote(tmp_path / "remote", 2)
    cache = ShardCache(tmp_path / "cache", 10 * SIZE)
    first = cache.get(LOCAL, *items[0])
    again = cache.get(LOCAL, *items[0])
    assert first == again == cache.path_for(items[0][3])
    assert first.read_bytes() == Path(items[0][0]).read_bytes()
    assert cache.stats.as_dict() == {"hits": 1, "misses": 1, "bytes_downloaded": SIZE, "evictions": 0}
    with cache.open(LOCAL, *items[1]) as handle:
        assert verify_file(handle, items[1][2], items[1][3]) == ""
    assert listing(cache) == sorted(f"{item[3]}.tar" for item in items)  # no temp files left


def test_corrupt_object_is_refused_and_not_cached(tmp_path):
    items = make_remote(tmp_path / "remote", 1)
    path, name, size, sha = items[0]
    data = bytearray(Path(path).read_bytes())
    data[100] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    cache = ShardCache(tmp_path / "cache", 10 * SIZE)
    with pytest.raises(CorruptShardError) as err:
        cache.get(LOCAL, path, name, size, sha)
    assert name in str(err.value) and "sha256" in str(err.value) and path in str(err.value)
    assert err.value.exit_code == 1
    Path(path).write_bytes(bytes(data) + b"extra")  # longer than the index says: stops early
    with pytest.raises(CorruptShardError, match="more than"):
        cache.get(LOCAL, path, name, size, sha)
    assert listing(cache) == []


def test_missing_object_and_oversized_shard(tmp_path):
    cache = ShardCache(tmp_path / "cache", 2 * SIZE)
    with pytest.raises(MissingShardError, match="shard-000009.tar.*missing"):
        cache.get(LOCAL, str(tmp_path / "nope.tar"), "shards/shard-000009.tar", SIZE, "0" * 64)
    big = make_remote(tmp_path / "remote", 1, size=4 * SIZE)[0]
    with pytest.raises(UsageError, match="at least one shard"):
        cache.get(LOCAL, *big)
    assert listing(cache) == []


def test_lru_eviction_keeps_total_under_limit(tmp_path):
    items = make_remote(tmp_path / "remote", 5)
    cache = ShardCache(tmp_path / "cache", 3 * SIZE)
    for item in items[:3]:
        cache.get(LOCAL, *item)
        time.sleep(0.01)  # distinct mtimes
    cache.get(LOCAL, *items[0])  # shard 0 is now the most recently used
    cache.get(LOCAL, *items[3])
    assert {p.stem for p in cache.dir.glob("*.tar")} == {items[0][3], items[2][3], items[3][3]}  # 1 was oldest
    with cache.open(LOCAL, *items[2]) as reading:  # evicted while open: the descriptor keeps working
        os.utime(cache.path_for(items[2][3]), (0, 0))  # make it the oldest
        cache.get(LOCAL, *items[4])
        assert not cache.path_for(items[2][3]).exists()
        assert verify_file(reading, items[2][2], items[2][3]) == ""
    assert cache.usage() == (3 * SIZE, 3)
    assert cache.stats.evictions == 2


def test_stale_download_of_a_dead_process_is_removed(tmp_path):
    cache = ShardCache(tmp_path / "cache", 3 * SIZE)
    stale = cache.dir / f".tmp-{'a' * 64}-99999-1"
    stale.write_bytes(b"\0" * SIZE)
    assert cache.usage() == (0, 0)
    assert not stale.exists()


def test_prefetch_downloads_ahead_and_keeps_errors_for_the_reader(tmp_path):
    items = make_remote(tmp_path / "remote", 3)
    Path(items[2][0]).write_bytes(b"x" * SIZE)  # right size, wrong bytes
    cache = ShardCache(tmp_path / "cache", 10 * SIZE, prefetch_shards=2)
    cache.prefetch(LOCAL, items[1:])
    deadline = time.monotonic() + 10
    while cache.stats.misses < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cache.path_for(items[1][3]).exists()
    cache.get(LOCAL, *items[1])
    assert cache.stats.hits == 1
    with pytest.raises(CorruptShardError, match="shard-000002"):
        cache.get(LOCAL, *items[2])
    assert cache.stats.misses == 2  # the reader got the prefetch's error, it did not download again
    cache.close()


def test_s3_object_through_the_cache(tmp_path, s3_bucket):
    from trainready.io import open_url

    fs, root = open_url(f"s3://{s3_bucket}/ds")
    data = os.urandom(3 * SIZE)
    fs.pipe_file(f"{root}/shards/shard-000000.tar", data)
    item = (f"{root}/shards/shard-000000.tar", "shards/shard-000000.tar", len(data), hashlib.sha256(data).hexdigest())
    cache = ShardCache(tmp_path / "cache", 10 * SIZE)
    assert cache.get(fs, *item).read_bytes() == data
    flipped = bytes([data[0] ^ 1]) + data[1:]
    fs.pipe_file(item[0], flipped)
    fresh = ShardCache(tmp_path / "cache2", 10 * SIZE)
    with pytest.raises(CorruptShardError, match=f"s3://{s3_bucket}/ds/shards/shard-000000.tar"):
        fresh.get(fs, *item)
    assert listing(fresh) == []
    with pytest.raises(MissingShardError):
        fresh.get(fs, f"{root}/shards/shard-000001.tar", "shards/shard-000001.tar", 1, "0" * 64)


HAMMER = """
import json, random, sys, fsspec
from trainready.data.cache import ShardCache, verify_file
cache_dir, limit, items, seed = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
cache, fs, rng = ShardCache(cache_dir, limit), fsspec.filesystem("file"), random.Random(seed)
for _ in range(40):
    item = rng.choice(items)
    with cache.open(fs, *item) as handle:
        assert verify_file(handle, item[2], item[3]) == "", item
    used, _ = cache.usage()
    assert used <= limit, used
"""


def test_four_processes_share_the_cache_within_its_limit(tmp_path):
    items = make_remote(tmp_path / "remote", 10, size=64 * 1024)
    limit = 3 * 64 * 1024
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [subprocess.Popen([sys.executable, "-c", HAMMER, str(tmp_path / "cache"), str(limit), json.dumps(items),
                               str(seed)], env=env, stderr=subprocess.PIPE) for seed in range(4)]
    watcher = ShardCache(tmp_path / "cache", limit)
    samples = []
    while any(p.poll() is None for p in procs):
        samples.append(watcher.usage()[0])
        time.sleep(0.002)
    errors = [p.stderr.read().decode() for p in procs if p.wait() != 0]
    assert not errors, errors
    assert len(samples) > 10 and max(samples) <= limit
    names = listing(watcher)
    assert not [n for n in names if n.startswith(".tmp-")]
    assert 1 <= len(names) <= 3
    for name in names:
        sha = name.removesuffix(".tar")
        with open(watcher.dir / name, "rb") as handle:
            assert verify_file(handle, 64 * 1024, sha) == ""
