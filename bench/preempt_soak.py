"""Soak: the documented checkpoint pattern (examples/train_with_checkpoints.py: async save, the
preemption handler, should_save every step) under torchrun with 2 gloo ranks, stopped with
SIGTERM at random steps, then run again with the same command.

Sweeps {sync, async} x {preemption handler on, off} x {when_busy wait, skip} x --trials random
steps. A trial holds when the stopped run ends within 60 s of the signal (no hang), the run
with the handler on resumed from at least the step it was signalled at (the preemption save was
committed), and the resumed run ends bit-identical to an uninterrupted one.

    .venv/bin/python bench/preempt_soak.py [--trials 3] [--steps 30] [--seed 1]

Prints one line per trial and how many held; exit 1 if any did not."""

from __future__ import annotations

import argparse
import itertools
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from preempt_helpers import Mode, reference_digest, trial  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3, help="random SIGTERM steps per combination")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.steps < 4:
        ap.error("--steps must be at least 4 (a signal needs a step to land on)")
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="preempt-soak-"))
    started = time.monotonic()
    held = total = 0
    try:
        reference = reference_digest(work / "reference", args.steps)
        modes = [Mode(sync, handler, busy) for sync, handler, busy in
                 itertools.product((False, True), (True, False), ("wait", "skip"))]
        for n, (mode, _) in enumerate(itertools.product(modes, range(args.trials))):
            stop_at = rng.randint(2, args.steps - 2)
            ok, why = trial(work / f"t{n}", mode, args.steps, stop_at, reference)
            shutil.rmtree(work / f"t{n}", ignore_errors=True)
            total += 1
            held += ok
            print(f"{'held ' if ok else 'FAILED'} 2 ranks {mode}  SIGTERM at step {stop_at:3}  {why}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{held}/{total} trials finished in time and resumed bit-identical ({time.monotonic() - started:.0f} s, "
          f"seed {args.seed})")
    return 0 if held == total else 1


if __name__ == "__main__":
    sys.exit(main())
