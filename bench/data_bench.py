"""Training data from S3: many small objects vs packed tar shards, through moto's S3 server.

    .venv/bin/python bench/data_bench.py                   # 20,000 files of 1-4 KiB
    .venv/bin/python bench/data_bench.py --files 2000      # quick

Part 1 writes one seeded corpus twice into a bucket: (a) one object per file under
s3://bench/objects/, (b) packed by `trainready.data.pack.pack` into s3://bench/packed. Then reads
every sample back: (a) one GET per object from a thread pool (as DataLoader workers would), (b)
with ShardedDataset, cold (empty cache) and warm (same cache, a new dataset object). moto runs on
127.0.0.1 and shares the CPUs with the reader: absolute numbers say little about real S3, where a
GET costs ~10-50 ms before its first byte; the ratio of request counts is what carries over."""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from s3server import MotoServer  # noqa: E402

BUCKET = "bench"
WORDS = ("the gradient flows through every layer while the optimizer steps and the loss falls slowly over many "
         "tokens batches shards nodes workers epochs checkpoints data loaders wait on storage latency").split()


def make_corpus(root: Path, files: int, seed: int) -> list[int]:
    """`files` text files of 1-4 KiB of seeded word salad in 100 subdirectories; returns their sizes."""
    rng = random.Random(seed)
    sizes = []
    for i in range(files):
        target = rng.randint(1024, 4096)
        words: list[str] = []
        length = 0
        while length < target:
            words.append(rng.choice(WORDS))
            length += len(words[-1]) + 1
        data = " ".join(words).encode()[:target]
        path = root / f"{i % 100:03d}" / f"doc-{i:06d}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        sizes.append(len(data))
    return sizes


def s3_client(endpoint: str, threads: int):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, config=Config(max_pool_connections=max(10, 2 * threads)))


def upload_objects(client, src: Path, threads: int) -> tuple[list[str], float]:
    started = time.monotonic()
    keys = [f"objects/{p.relative_to(src).as_posix()}" for p in sorted(src.rglob("*.txt"))]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=BUCKET, Key=key, Body=(src / key[8:]).read_bytes()), keys))
    return keys, time.monotonic() - started


def read_objects(client, threads: int) -> tuple[int, int, int, float]:
    """(samples, bytes, requests, seconds): list the prefix, then one GET per object from `threads` threads."""
    started = time.monotonic()
    keys, requests = [], 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="objects/"):
        requests += 1
        keys += [obj["Key"] for obj in page.get("Contents", [])]

    def get(key: str) -> int:
        return len(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(get, keys))
    return len(keys), total, requests + len(keys), time.monotonic() - started


def count_requests(fs) -> collections.Counter:
    """Count every S3 call the (cached, shared) s3fs instance makes, by method."""
    counts: collections.Counter = collections.Counter()
    original = fs._call_s3

    async def counted(method, *args, **kwargs):
        counts[method] += 1
        return await original(method, *args, **kwargs)

    fs._call_s3 = counted
    return counts


def read_shards(url: str, cache_dir: str, counts: collections.Counter) -> tuple[int, int, int, float]:
    """(samples, bytes, requests, seconds) of one pass over every sample with ShardedDataset (rank 0 of 1, in order)."""
    from trainready.data.dataset import ShardedDataset

    before = sum(counts.values())
    started = time.monotonic()
    ds = ShardedDataset(url, shuffle=False, cache_dir=cache_dir, rank=0, world_size=1)
    samples = total = 0
    for text in ds:
        samples += 1
        total += len(text.encode())
    ds.close()
    return samples, total, sum(counts.values()) - before, time.monotonic() - started


def part1(endpoint: str, args: argparse.Namespace) -> dict[str, tuple[int, int, int, float]]:
    """Objects vs shards: write the corpus both ways, read it back, print the table."""
    from trainready.data.pack import pack
    from trainready.io import open_url

    client = s3_client(endpoint, args.threads)
    client.create_bucket(Bucket=BUCKET)
    rows: dict[str, tuple[int, int, int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="data-bench-") as tmp:
        src = Path(tmp) / "corpus"
        src.mkdir()
        started = time.monotonic()
        sizes = make_corpus(src, args.files, args.seed)
        print(f"corpus: {len(sizes):,} files, {sum(sizes) / 1e6:.1f} MB (median {sorted(sizes)[len(sizes) // 2]:,} B), "
              f"made in {time.monotonic() - started:.1f} s")
        url = f"s3://{BUCKET}/packed"
        packed = pack(src, url, "text", args.shard_size << 20)
        print(f"packed: {packed.shards_total} shard(s) of <= {args.shard_size} MiB in {packed.seconds:.1f} s")
        if not args.skip_objects:
            keys, seconds = upload_objects(client, src, args.threads)
            print(f"objects: {len(keys):,} PUTs in {seconds:.1f} s ({args.threads} threads)")
            rows["objects"] = read_objects(client, args.threads)
        fs, _ = open_url(url)
        counts = count_requests(fs)
        cache = Path(tmp) / "shard-cache"
        rows["shards cold"] = read_shards(url, str(cache), counts)
        rows["shards warm"] = read_shards(url, str(cache), counts)
        if rows["shards cold"][2] == 0:
            print("(request counts for shards not seen: the dataset did not share the counted s3fs instance)")
    print(f"\n{'read':<12} {'samples':>9} {'requests':>9} {'seconds':>8} {'samples/s':>10} {'MB/s':>7}")
    for name, (samples, total, requests, seconds) in rows.items():
        rate, mbps = samples / seconds, total / seconds / 1e6
        print(f"{name:<12} {samples:>9,} {requests:>9,} {seconds:>8.2f} {rate:>10,.0f} {mbps:>7.1f}")
    if "objects" in rows:
        obj, cold = rows["objects"], rows["shards cold"]
        assert obj[0] == cold[0] == args.files and obj[1] == cold[1] == sum(sizes), "the two layouts read different data"
        print(f"\nshards are {obj[3] / cold[3]:.1f}x faster than objects (cold cache; {args.threads} threads on objects, "
              f"one reader on shards), with {obj[2]:,} requests vs {cold[2]:,}")
    return rows


def part2(args: argparse.Namespace) -> None:
    """examples/tiny_gpt.py --data from shards on the local S3 server, 2 processes under `trainready run`:
    the data-wait share of the step time (after warm-up), with a cold and then a warm shard cache."""
    import json
    import subprocess

    from trainready.data.pack import pack

    root = Path(tempfile.mkdtemp(prefix="data-bench-train-"))
    example = Path(__file__).resolve().parents[1] / "examples" / "tiny_gpt.py"
    try:
        subprocess.run([sys.executable, str(example), "--write-corpus", str(root / "corpus")], check=True,
                       capture_output=True)
        packed = pack(root / "corpus", "s3://bench/tiny", "tokens", 256 << 10)
        env = {**os.environ, "TMPDIR": str(root)}  # the shard cache: fresh for the first run, warm for the second
        print(f"\ntraining from shards: tiny_gpt, 2 processes, {args.train_steps} steps, "
              f"{packed.shards_total} shards of <= 256 KiB on the local S3 server")
        for label in ("cold cache", "warm cache"):
            run_dir = root / label.replace(" ", "-")
            cmd = [sys.executable, "-m", "trainready", "run", "--run-dir", str(run_dir), "--nproc-per-node", "2",
                   "--", "python", str(example), "--steps", str(args.train_steps), "--data", "s3://bench/tiny",
                   "--data-workers", "1"]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{label}: run failed ({done.returncode}):\n{done.stderr[-2000:]}")
                continue
            summary = json.loads((run_dir / "summary.json").read_text())
            shares = summary["shares"]
            print(f"{label}: data wait {shares['data']:.1%} of step time (target < 2% warm), compute "
                  f"{shares['compute']:.0%}, comm {shares['comm']:.0%}; {summary['tokens_per_s_median']:,.0f} tokens/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000, help="small files in the corpus (1-4 KiB of text each)")
    parser.add_argument("--threads", type=int, default=8, help="threads reading objects (like DataLoader workers)")
    parser.add_argument("--shard-size", type=int, default=16, help="shard size in MiB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-objects", action="store_true", help="only the packed layout (part 1 without (a))")
    parser.add_argument("--train-steps", type=int, default=60, help="tiny_gpt steps in part 2 (0: skip part 2)")
    args = parser.parse_args()
    print(f"trainready data bench, {datetime.datetime.now().isoformat(timespec='seconds')}: moto_server on 127.0.0.1 "
          f"sharing {os.cpu_count()} CPUs with the reader, so absolute numbers say little about real S3 "
          "(~10-50 ms to first byte per GET); the ratio of request counts is what carries over")
    server = MotoServer()
    try:
        os.environ.update(AWS_ENDPOINT_URL_S3=server.url, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret",
                          AWS_DEFAULT_REGION="us-east-1")
        os.environ.pop("AWS_ENDPOINT_URL", None)
        os.environ.pop("AWS_PROFILE", None)
        part1(server.url, args)
        if args.train_steps:
            part2(args)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
