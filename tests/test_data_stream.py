"""ShardedDataset: rank/worker assignment, shuffling, exact resume, corrupt shards, S3 through the cache."""

from __future__ import annotations

import hashlib
import io
import logging
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from trainready.data.cache import CorruptShardError
from trainready.data.dataset import ShardedDataset, Throughput, shard_order, span_runs, worker_span
from trainready.data.format import EXT, DataIndex, ShardInfo, SourceInfo, SourcePosition, add_member, sample_key, shard_name
from trainready.errors import UsageError

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's, not ours
SHARD_SIZES = (70, 90, 83)  # uneven on purpose: blocks must cross shard boundaries anywhere


def pack(root: Path, samples: list[bytes], fmt: str = "text") -> DataIndex:
    """A packed dataset the way `trainready data pack` lays it out (tar shards + index.json)."""
    shards, first, number = [], 0, 0
    while first < len(samples):
        count = min(SHARD_SIZES[number % len(SHARD_SIZES)], len(samples) - first)
        path = root / shard_name(number)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
            for ordinal in range(first, first + count):
                add_member(tar, f"{sample_key(ordinal)}.{EXT[fmt]}", samples[ordinal])
        data = path.read_bytes()
        tokens = sum(len(s) for s in samples[first:first + count])
        shards.append(ShardInfo(name=shard_name(number), samples=count, bytes=len(data), tokens=tokens,
                                sha256=hashlib.sha256(data).hexdigest(), first_sample=first,
                                source_end=SourcePosition(file=0, record=first + count)))
        first, number = first + count, number + 1
    index = DataIndex(format=fmt, tokens_counted_as="tokens" if fmt == "tokens" else "bytes",
                      token_dtype="uint16" if fmt == "tokens" else None, shard_size_bytes=1 << 20,
                      source=SourceInfo(path="src", files=1, fingerprint="0" * 64), shards=shards, complete=True)
    (root / "index.json").write_text(index.model_dump_json())
    return index


def texts(n: int) -> list[bytes]:
    return [f"sample {i} ".encode() * (1 + i % 5) for i in range(n)]


@pytest.fixture(scope="module")
def data1000(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds1000")
    pack(root, texts(1000))
    return root


@pytest.fixture(scope="module")
def data999(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds999")
    pack(root, texts(999))
    return root


def keys_of(ds: ShardedDataset) -> list[str]:
    return [key for key, _ in ds]


def loader_keys(ds: ShardedDataset, workers: int = 2, batch: int = 16) -> list[str]:
    return [k for keys, _ in DataLoader(ds, batch_size=batch, num_workers=workers) for k in keys]


def test_two_ranks_two_workers_split_everything_disjointly(data1000):
    per_rank = [loader_keys(ShardedDataset(data1000, rank=r, world_size=2, with_keys=True, shuffle_buffer=64))
                for r in range(2)]
    assert [len(keys) for keys in per_rank] == [500, 500]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == [sample_key(i) for i in range(1000)]


def test_odd_count_drop_and_pad(data999):
    drop = [keys_of(ShardedDataset(data999, rank=r, world_size=2, with_keys=True)) for r in range(2)]
    assert [len(k) for k in drop] == [499, 499] and not set(drop[0]) & set(drop[1])
    dropped = {sample_key(i) for i in range(999)} - set(drop[0]) - set(drop[1])
    assert len(dropped) == 1
    other = []
    for r in range(2):
        ds = ShardedDataset(data999, rank=r, world_size=2, with_keys=True)
        ds.set_epoch(1)
        other += keys_of(ds)
    assert {sample_key(i) for i in range(999)} - set(other) != dropped  # which one drops rotates with the epoch

    pad = [keys_of(ShardedDataset(data999, rank=r, world_size=2, with_keys=True, remainder="pad")) for r in range(2)]
    assert [len(k) for k in pad] == [500, 500]
    counts = Counter(pad[0] + pad[1])
    assert set(counts) == {sample_key(i) for i in range(999)} and sorted(counts.values())[-1] == 2
    assert sum(c - 1 for c in counts.values()) == 1


def test_blocks_are_contiguous_and_read_few_shards():
    sizes = [83] * 12
    for total, world, workers in [(996, 4, 3), (995, 3, 2), (7, 4, 3)]:
        spans = [worker_span(total, r, world, k, workers, "drop") for r in range(world) for k in range(workers)]
        lengths = [b - a for a, b in spans]
        assert max(lengths) - min(lengths) <= 1 and spans[0][0] == 0
        assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))  # contiguous, disjoint
    order = shard_order(12, seed=3, epoch=0, shuffle=True)
    touched = [{s for s, _, _ in span_runs(worker_span(996, r, 4, 0, 1, "drop"), order, sizes)} for r in range(4)]
    assert all(len(t) <= 4 for t in touched)  # each of 4 ranks reads ~1/4 of 12 shards (plus boundary shards)
    assert span_runs(worker_span(10, 2, 3, 0, 1, "pad"), [0, 1], [6, 4]) == [(1, 2, 4), (0, 0, 2)]  # wraps


def test_shuffle_is_deterministic_per_seed_and_epoch(data1000):
    def order(seed: int, epoch: int, **kw) -> list[str]:
        ds = ShardedDataset(data1000, seed=seed, rank=0, world_size=1, with_keys=True, shuffle_buffer=100, **kw)
        ds.set_epoch(epoch)
        return keys_of(ds)

    first = order(0, 0)
    assert first == order(0, 0) and sorted(first) == [sample_key(i) for i in range(1000)]
    assert first != order(0, 1) and first != order(1, 0)
    assert order(0, 0, shuffle=False) == [sample_key(i) for i in range(1000)]


@pytest.mark.parametrize("buffer", [0, 50, 2000])  # no buffer, a small one, one bigger than the worker's block
def test_exact_resume_at_every_kind_of_position(data999, buffer):
    def fresh() -> ShardedDataset:
        ds = ShardedDataset(data999, rank=1, world_size=2, with_keys=True, shuffle_buffer=buffer, seed=7)
        ds.set_epoch(2)
        return ds

    reference = keys_of(fresh())
    for stop in (0, 1, 49, 50, 51, 300, 460, 498, 499):  # inside the fill, the steady state, the final flush, the end
        ds = fresh()
        it = iter(ds)
        head = [next(it)[0] for _ in range(stop)]
        state = ds.state_dict()
        assert state["epoch"] == 2 and state["samples_yielded"] == stop
        resumed = ShardedDataset(data999, rank=1, world_size=2, with_keys=True, shuffle_buffer=buffer, seed=7)
        resumed.load_state_dict(state)  # the state carries epoch 2: no set_epoch needed
        assert head + keys_of(resumed) == reference, stop
    assert list(it) == [] and ds.state_dict()["epoch_done"]
    state = ds.state_dict()  # after the whole epoch: the next one starts once set_epoch moves on
    resumed = fresh()
    resumed.load_state_dict(state)
    resumed.set_epoch(3)
    following = fresh()
    following.set_epoch(3)
    assert keys_of(resumed) == keys_of(following) != reference


def batches(loader) -> list[list[str]]:
    return [list(keys) for keys, _ in loader]


@pytest.mark.parametrize("workers", [2, 0])
def test_stateful_dataloader_resumes_mid_epoch_and_across_epochs(data999, workers):
    def make_loader(root, epoch: int) -> tuple[ShardedDataset, StatefulDataLoader]:
        ds = ShardedDataset(root, rank=0, world_size=2, with_keys=True, shuffle_buffer=40, seed=1)
        ds.set_epoch(epoch)
        return ds, StatefulDataLoader(ds, batch_size=8, num_workers=workers)

    _, loader = make_loader(data999, 0)
    epoch0 = batches(loader)
    assert sum(len(b) for b in epoch0) == 499
    _, loader = make_loader(data999, 1)
    epoch1 = batches(loader)

    _, loader = make_loader(data999, 0)  # stop after 20 batches, resume in a new loader
    it = iter(loader)
    head = [list(next(it)[0]) for _ in range(20)]
    state = loader.state_dict()
    del it, loader
    ds, loader = make_loader(data999, 0)
    loader.load_state_dict(state)
    assert head + batches(loader) == epoch0
    state = loader.state_dict()  # taken at the end of epoch 0

    ds, loader = make_loader(data999, 0)
    loader.load_state_dict(state)
    ds.set_epoch(1)
    it = iter(loader)
    head = [list(next(it)[0]) for _ in range(5)]
    state = loader.state_dict()
    assert head == epoch1[:5]
    del it, loader
    ds, loader = make_loader(data999, 1)
    loader.load_state_dict(state)
    assert head + batches(loader) == epoch1


def corrupt(root: Path, number: int) -> str:
    path = root / shard_name(number)
    data = bytearray(path.read_bytes())
    data[700] ^= 0xFF  # inside the first member's bytes: the tar still parses, only the hash tells
    path.write_bytes(bytes(data))
    return shard_name(number)


def test_corrupt_shard_is_named_or_skipped_and_resume_still_exact(tmp_path, caplog):
    index = pack(tmp_path, texts(600))
    name = corrupt(tmp_path, 2)
    with pytest.raises(CorruptShardError, match=f"{name}.*sha256"):
        keys_of(ShardedDataset(tmp_path, with_keys=True, rank=0, world_size=1))

    def skipping() -> ShardedDataset:
        return ShardedDataset(tmp_path, with_keys=True, rank=0, world_size=1, on_corrupt="skip", shuffle_buffer=30)

    with caplog.at_level(logging.WARNING, logger="trainready.data.dataset"):
        ds = skipping()
        got = keys_of(ds)
    bad = index.shards[2]
    assert sorted(got) == [sample_key(i) for i in range(600) if not bad.first_sample <= i < bad.first_sample + bad.samples]
    assert ds.skipped_shards == 1 and ds.state_dict()["skipped_runs"] and name in caplog.text
    for stop in (10, 400, len(got) - 5):
        ds = skipping()
        it = iter(ds)
        head = [next(it)[0] for _ in range(stop)]
        resumed = skipping()
        resumed.load_state_dict(ds.state_dict())
        assert head + keys_of(resumed) == got


def test_s3_dataset_through_the_cache(tmp_path, s3_bucket, data1000):
    from trainready.io import open_url

    fs, root = open_url(f"s3://{s3_bucket}/ds")
    for path in sorted(data1000.rglob("*")):
        if path.is_file():
            fs.pipe_file(f"{root}/{path.relative_to(data1000).as_posix()}", path.read_bytes())
    url = f"s3://{s3_bucket}/ds"
    local = [keys_of(ShardedDataset(data1000, rank=r, world_size=2, with_keys=True)) for r in range(2)]
    remote = []
    for r in range(2):
        ds = ShardedDataset(url, rank=r, world_size=2, with_keys=True, cache_dir=tmp_path / "cache", prefetch_shards=2)
        remote.append(keys_of(ds))
    assert remote == local
    stats = ds.cache_stats
    assert stats["misses"] >= 1 and stats["bytes_downloaded"] > 0 and stats["hits"] >= 1
    in_workers = ShardedDataset(url, rank=1, world_size=2, with_keys=True, cache_dir=tmp_path / "cache4")
    assert loader_keys(in_workers) == loader_keys(ShardedDataset(data1000, rank=1, world_size=2, with_keys=True))

    flipped = bytearray(fs.cat_file(f"{root}/{shard_name(5)}"))
    flipped[700] ^= 1
    fs.pipe_file(f"{root}/{shard_name(5)}", bytes(flipped))
    ds = ShardedDataset(url, rank=0, world_size=1, with_keys=True, cache_dir=tmp_path / "cache2")
    with pytest.raises(CorruptShardError, match=f"s3://{s3_bucket}/ds/{shard_name(5)}"):
        keys_of(ds)
    ds.close()  # let a prefetch of the bad shard in flight end (it removes its own download)
    bad = ds.index.shards[5].sha256
    assert not list((tmp_path / "cache2").glob(f"*{bad}*"))  # other shards may be cached, never the bad one

    fs.rm_file(f"{root}/{shard_name(7)}")
    ds = ShardedDataset(url, rank=0, world_size=1, with_keys=True, cache_dir=tmp_path / "cache3", on_corrupt="skip")
    got = keys_of(ds)
    ds.close()
    lost = {sample_key(ds.index.shards[n].first_sample + i) for n in (5, 7) for i in range(ds.index.shards[n].samples)}
    assert ds.skipped_shards == 2 and sorted(got) == sorted({sample_key(i) for i in range(1000)} - lost)


def test_tokens_format_and_throughput(tmp_path):
    arrays = [np.arange(i % 7 + 1, dtype=np.uint16) for i in range(50)]
    blobs = []
    for array in arrays:
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        blobs.append(buf.getvalue())
    pack(tmp_path, blobs, fmt="tokens")
    meter = Throughput()
    for sample in ShardedDataset(tmp_path, rank=0, world_size=1, shuffle=False):
        assert isinstance(sample, np.ndarray)
        meter.add(sample)
    report = meter.report()
    assert report["samples"] == 50 and report["tokens"] == sum(len(a) for a in arrays)
    raw = next(iter(ShardedDataset(tmp_path, rank=0, world_size=1, shuffle=False, decode=False)))
    assert raw["key"] == sample_key(0) and raw["data"] == blobs[0]


def test_bad_arguments_and_missing_dataset(tmp_path, data1000):
    with pytest.raises(UsageError, match="no packed dataset"):
        ShardedDataset(tmp_path / "nothing")
    with pytest.raises(UsageError, match="holds text samples"):
        ShardedDataset(data1000, format="tokens")
    with pytest.raises(UsageError, match="rank 2"):
        ShardedDataset(data1000, rank=2, world_size=2)
    ds = ShardedDataset(data1000, rank=0, world_size=2)
    state = ds.state_dict()
    other = ShardedDataset(data1000, rank=0, world_size=2, seed=5)
    other.load_state_dict(state)
    with pytest.raises(UsageError, match="seed 0 -> 5"):
        iter(other)
