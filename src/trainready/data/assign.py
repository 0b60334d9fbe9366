"""Who reads which samples, as pure functions of (seed, epoch, rank, worker), and the shuffle
buffer replayed over indices for exact resume; plus the throughput counter the bench uses.
The rules are described in dataset.py's docstring."""

from __future__ import annotations

import bisect
import json
import random
import time
from typing import Any

Run = tuple[int, int, int]  # (shard index, first offset, end offset) of a contiguous piece of a worker's block


def shard_order(n_shards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    order = list(range(n_shards))
    if shuffle:
        random.Random(f"shard-order/{seed}/{epoch}").shuffle(order)
    return order


def samples_per_rank(total: int, world: int, remainder: str) -> int:
    """Equal for every rank: the remainder dropped, or padded by wrapping around."""
    return total // world if remainder == "drop" else -(-total // world)


def worker_span(total: int, rank: int, world: int, worker: int, workers: int, remainder: str) -> tuple[int, int]:
    """[start, stop) in the epoch's sample sequence; stop may pass `total` with "pad" (it wraps)."""
    per_rank = samples_per_rank(total, world, remainder)
    base = rank * per_rank
    return base + worker * per_rank // workers, base + (worker + 1) * per_rank // workers


def span_runs(span: tuple[int, int], order: list[int], sizes: list[int]) -> list[Run]:
    """The span as runs of consecutive samples inside one shard each, in reading order."""
    starts, at = [], 0
    for shard in order:
        starts.append(at)
        at += sizes[shard]
    runs, pos, stop = [], *span
    while pos < stop and at:
        i = bisect.bisect_right(starts, pos % at) - 1  # the last of equal starts: never an empty shard
        lo = pos % at - starts[i]
        take = min(stop - pos, sizes[order[i]] - lo)
        runs.append((order[i], lo, lo + take))
        pos += take
    return runs


def simulate_buffer(n_inputs: int, size: int, rng: random.Random, outputs: int) -> tuple[list[int], int, list[int] | None]:
    """Run the shuffle buffer over input indices until `outputs` have come out: (indices in the
    buffer slots, inputs taken, remaining flush order or None if the input was not exhausted).
    Must consume `rng` exactly as ShardedDataset._shuffled does."""
    slots: list[int] = []
    taken = done = 0
    while taken < n_inputs and done < outputs:
        if len(slots) < size:
            slots.append(taken)
        else:
            slots[rng.randrange(size)] = taken
            done += 1
        taken += 1
    if done < outputs:
        rng.shuffle(slots)
        return slots, taken, slots[outputs - done:]
    return slots, taken, None


class Throughput:
    """Rates for `trainready data bench`: samples, bytes and tokens per second. Tokens are the
    array length of token samples and bytes otherwise (as index.json's tokens_counted_as says)."""

    def __init__(self) -> None:
        self.start, self.samples, self.bytes, self.tokens = time.monotonic(), 0, 0, 0

    def add(self, sample: Any) -> None:
        sample = sample[1] if isinstance(sample, tuple) else sample  # with_keys=True
        sample = sample["data"] if isinstance(sample, dict) and set(sample) == {"key", "data"} else sample  # decode=False
        if hasattr(sample, "nbytes"):
            size, tokens = int(sample.nbytes), len(sample)
        else:
            raw = json.dumps(sample).encode() if isinstance(sample, dict) else sample
            size = tokens = len(raw.encode() if isinstance(raw, str) else raw)
        self.samples, self.bytes, self.tokens = self.samples + 1, self.bytes + size, self.tokens + tokens

    def report(self) -> dict[str, float]:
        seconds = max(time.monotonic() - self.start, 1e-9)
        return {"samples": self.samples, "bytes": self.bytes, "tokens": self.tokens, "seconds": seconds,
                "samples_per_s": self.samples / seconds, "bytes_per_s": self.bytes / seconds,
                "tokens_per_s": self.tokens / seconds}
