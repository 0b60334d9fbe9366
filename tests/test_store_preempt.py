"""The documented pattern (examples/train_with_checkpoints.py) on 2 ranks, stopped with SIGTERM:
it used to hang (should_save's collective on the training thread interleaved with the writer
thread's collectives on the same gloo group). It must stop in time and resume bit-identical.
bench/preempt_soak.py sweeps every combination; these are the representative few."""

from __future__ import annotations

import pytest
from preempt_helpers import Mode, reference_digest, trial
from shared_runs import shared_result

STEPS = 16


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's digest, made once per session: each xdist worker that took one of the trials below used
    to make its own (two 10 s runs where one does)."""
    return shared_result(tmp_path_factory, "preempt-reference", lambda folder: reference_digest(folder, STEPS))


@pytest.mark.parametrize("mode, stop_at", [
    (Mode(sync=False, handler=True, when_busy="wait"), 7),   # the combination that hung
    (Mode(sync=False, handler=True, when_busy="skip"), 5),   # skip decided per rank used to split the ranks
    (Mode(sync=False, handler=False, when_busy="wait"), 9),  # no handler: SIGTERM kills, the last commit resumes
])
def test_sigterm_on_two_ranks_stops_in_time_and_resumes_bit_identical(mode, stop_at, reference, tmp_path):
    held, why = trial(tmp_path, mode, STEPS, stop_at, reference)
    assert held, why
