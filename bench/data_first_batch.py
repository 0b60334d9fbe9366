"""Time to the first batch of each epoch with forkserver DataLoader workers: bare vs worker_context().

    .venv/bin/python bench/data_first_batch.py                 # 3 epochs, 2 workers, each case once
    .venv/bin/python bench/data_first_batch.py --repeats 3     # medians of 3 fresh processes

Every epoch's iter() starts new workers (persistent_workers=False, so set_epoch reaches them).
A bare forkserver preloads only the main script, and only when it was started as a file, so each
worker imports torch again, and under `python -m pkg.train` runs the whole training module again.
worker_context() preloads both. Each case is a fresh training-like process (as a resume is):
  script   `python train.py`, which imports torch inside main() (the worker cannot inherit it)
  module   `python -m train_mod`, torch imported at the top of the module
Epoch 0 includes starting the forkserver itself (worker_context() starts it while the script
goes on building its dataset). Prints one row per case: seconds to the first batch per epoch.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRAIN = '''
import sys, time

def main():
    import torch
    from torch.utils.data import DataLoader
    from trainready.data import ShardedDataset, worker_context
    url, mode, epochs, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    context = worker_context() if mode == "preload" else "forkserver"
    ds = ShardedDataset(url, rank=0, world_size=1, seed=0)
    loader = DataLoader(ds, batch_size=8, num_workers=workers, multiprocessing_context=context,
                        collate_fn=torch.utils.data.default_collate)
    times = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        start = time.perf_counter()
        it = iter(loader)
        next(it)
        times.append(time.perf_counter() - start)
        for _ in it:
            pass
    print("FIRST_BATCH", *(f"{t:.3f}" for t in times), flush=True)
'''
SCRIPT = TRAIN + '\nif __name__ == "__main__":\n    main()\n'
MODULE = "import torch  # noqa: F401 - a training module imports torch at the top\n" + SCRIPT


def make_dataset(root: Path, samples: int) -> str:
    from trainready.data.pack import pack

    src = root / "src"
    src.mkdir()
    for i in range(samples):
        (src / f"doc{i:05d}.txt").write_text(f"sample {i} " * 20)
    pack(src, str(root / "ds"), "text", 1 << 20)
    return str(root / "ds")


def run_case(tmp: Path, shape: str, mode: str, url: str, epochs: int, workers: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(tmp), os.environ.get("PYTHONPATH", "")])}
    target = ["-m", "train_mod"] if shape == "module" else [str(tmp / "train.py")]
    proc = subprocess.run([sys.executable, *target, url, mode, str(epochs), str(workers)], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=600)
    found = [line for line in proc.stdout.splitlines() if line.startswith("FIRST_BATCH")]
    if proc.returncode != 0 or not found:
        raise SystemExit(f"{shape}/{mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return [float(x) for x in found[-1].split()[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainready-first-batch-") as name:
        tmp = Path(name)
        (tmp / "train.py").write_text(SCRIPT)
        (tmp / "train_mod.py").write_text(MODULE)
        url = make_dataset(tmp, args.samples)
        print(f"# {datetime.date.today()}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
              f"{args.workers} workers, medians of {args.repeats}; seconds to the first batch of each epoch")
        print(f"{'case':<38}" + "".join(f"{'epoch ' + str(e):>10}" for e in range(args.epochs)))
        for shape, how in (("script", "python train.py"), ("module", "python -m train_mod")):
            for mode, label in (("bare", "forkserver"), ("preload", "worker_context()")):
                runs = [run_case(tmp, shape, mode, url, args.epochs, args.workers) for _ in range(args.repeats)]
                medians = [statistics.median(r[e] for r in runs) for e in range(args.epochs)]
                print(f"{how + ', ' + label:<38}" + "".join(f"{m:>10.2f}" for m in medians), flush=True)


if __name__ == "__main__":
    main()
