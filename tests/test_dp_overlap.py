"""Data-parallel reductions and gathers split over interleaved model chunks (performance.chunked_*): the closed
forms agree with an event simulation of the schedule written out pass by pass, bucket by bucket."""

import random

import pytest

from trainready.plan.performance import chunked_gather_exposed, chunked_reduce_exposed

BUCKETS = 2000  # a chunk's buckets, released evenly through its pass: the closed forms leave out one bucket's tail


def _simulated_reduce(reduce_s: float, bwd_s: float, chunks: int, group: int) -> float:
    """The last micro-batch group's backward, chunk by chunk (v - 1 first), `group` passes each; a chunk's buckets
    become ready through its last pass and queue on one communication stream."""
    p, c = bwd_s / chunks, reduce_s / chunks / BUCKETS
    t = stream = 0.0
    for _ in range(chunks):
        t += (group - 1) * p  # the chunk's earlier micro-batches
        for b in range(1, BUCKETS + 1):
            stream = max(stream, t + b * p / BUCKETS) + c
        t += p
    return max(0.0, stream - t)


def _simulated_gather(gather_s: float, fwd_s: float, chunks: int, group: int) -> float:
    """The first micro-batch group's forwards, chunk by chunk; chunk k's gather is launched at the step's start
    (k < 2) or when chunk k - 1's first forward begins; a pass runs its buckets' layers as each bucket arrives. With
    several chunks the buckets go out last layer first (Megatron's aligned gathers), with one in the layers' order."""
    q, c = fwd_s / chunks, gather_s / chunks / BUCKETS
    stream = t = 0.0
    starts = []
    for k in range(chunks):
        launch = 0.0 if k < 2 else starts[k - 1]
        arrived = []
        for _ in range(BUCKETS):
            stream = max(stream, launch) + c
            arrived.append(stream)
        if chunks > 1:
            arrived.reverse()  # the first layer's bucket was sent last
        starts.append(t)
        for b in range(BUCKETS):
            t = max(t, arrived[b]) + q / BUCKETS
        t += (group - 1) * q
    return max(0.0, t - chunks * group * q)


def test_one_chunk_is_the_last_micro_batch_window():
    assert chunked_reduce_exposed(3.0, 1.0, 1, 4) == pytest.approx(2.0)
    assert chunked_reduce_exposed(0.5, 1.0, 1, 4) == 0.0
    assert chunked_gather_exposed(3.0, 1.0, 1, 4) == pytest.approx(2.0)
    assert chunked_gather_exposed(0.5, 1.0, 1, 4) == 0.0


@pytest.mark.parametrize("seed", range(40))
def test_closed_forms_match_the_schedule_simulated(seed):
    rng = random.Random(seed)
    chunks, group = rng.choice([1, 2, 3, 5, 8, 12]), rng.choice([1, 2, 4, 8])
    comm, compute = rng.uniform(0.01, 2.0), rng.uniform(0.01, 1.0)
    tol = 2 * (comm + compute) / chunks / BUCKETS + 1e-9  # a bucket's transfer and its layers' pass
    assert chunked_reduce_exposed(comm, compute, chunks, group) == pytest.approx(
        _simulated_reduce(comm, compute, chunks, group), abs=tol)
    assert chunked_gather_exposed(comm, compute, chunks, group) == pytest.approx(
        _simulated_gather(comm, compute, chunks, group), abs=tol)


def test_more_chunks_hide_more_and_never_less_than_one_chunk_would():
    for comm in (0.2, 0.4, 1.0, 3.0):
        one = chunked_reduce_exposed(comm, 0.09, 1, 4)
        twelve = chunked_reduce_exposed(comm, 0.09, 12, 4)
        assert twelve <= one
        assert chunked_gather_exposed(comm, 0.045, 12, 4) <= chunked_gather_exposed(comm, 0.045, 1, 4)
    # Nemotron-4 340B on 128 B200 (pp 4 x 12, a 0.40 s reduce-scatter against a 0.088 s stage backward): most of
    # the reduction hides behind the cooldown's later chunks
    assert chunked_reduce_exposed(0.396, 0.0878, 12, 4) == pytest.approx(0.396 - 0.0878 * 45 / 12)
