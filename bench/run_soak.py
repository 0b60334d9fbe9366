"""Soak for the `trainready run` determinism contract: examples/tiny_gpt.py on 2 gloo processes,
killed at every checkpoint fault point and at many moments, restarted with the same command,
must end with the uninterrupted run's digest and per-step losses.

Trials (each: a killed launch, then the same command again):
* every fault point in trainready.store.faults.POINTS (hang there, SIGKILL the launcher, check
  that no worker outlives it), on the 2nd save, with a local archive and (--s3) through moto;
  with --s3 the hot tier is also wiped before the restart, so the checkpoint comes from S3;
* the launcher SIGKILLed after step k for --moments values of k;
* a worker SIGKILLed after step k (torchrun restarts it within the same command).

    .venv/bin/python bench/run_soak.py [--s3] [--moments 3,9,17,28,36]

Prints one line per trial and how many held; exit 1 if any did not."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from run_helpers import (  # noqa: E402
    alive,
    digest,
    kill_launcher,
    losses,
    records,
    run,
    run_cmd,
    start,
    wait_for,
    worker_pids,
)

from trainready.store.faults import POINTS  # noqa: E402

STEPS = 40
OPTS = ("--nproc-per-node", "2", "--ckpt-every", "5")


def same_as(base: tuple[str, dict], run_dir: Path, out: str) -> str | None:
    if digest(out) != base[0]:
        return f"digest {digest(out)} != {base[0]}"
    steps = [r for r in records(run_dir) if r["type"] == "step"]
    if {r["step"] for r in steps} != set(range(STEPS)):
        return "missing steps"
    bad = [r["step"] for r in steps if r["metrics"]["loss"] != base[1][r["step"]]]
    return f"losses differ at steps {bad[:5]}" if bad else None


def point_trial(base, tmp: Path, point: str, archive: str | None, wipe_hot: bool) -> tuple[bool, str]:
    run_dir, marker = tmp / "run", tmp / "marker"
    opts = [*OPTS, *(["--archive", archive] if archive else [])]
    cmd = run_cmd(run_dir, *opts, steps=STEPS)
    if point == "restore.downloaded":  # a restore must happen first: stop one run, wipe hot, fault the next
        proc = start(cmd, tmp)
        wait_for(lambda: any(r["type"] == "ckpt" and r["step"] >= 9 for r in records(run_dir)), 120, "2 saves")
        time.sleep(1.0)  # let the upload finish
        kill_launcher(proc, run_dir)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    hit = 1 if point == "restore.downloaded" else 2  # a restore downloads once; the others fire on every save
    proc = start(cmd, tmp, {"TRAINREADY_FAULT": f"{point}:hang#{hit}", "TRAINREADY_FAULT_MARKER": str(marker)})
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, 120, point)
    except TimeoutError:
        proc.kill()
        return False, "timed out"
    if not marker.exists():
        return True, "point not reached (nothing to check)"
    kill_launcher(proc, run_dir)
    if wipe_hot:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    code, out = run(cmd, tmp, timeout=300)
    if code != 0:
        return False, f"restart exited {code}: {out[-500:]}"
    problem = same_as(base, run_dir, out)
    return problem is None, problem or "held"


def moment_trial(base, tmp: Path, after: int, victim: str) -> tuple[bool, str]:
    run_dir = tmp / "run"
    opts = [*OPTS, "--max-restarts", "2"] if victim == "worker" else list(OPTS)
    cmd = run_cmd(run_dir, *opts, steps=STEPS)
    proc = start(cmd, tmp)
    wait_for(lambda: any(r["type"] == "step" and r["step"] >= after for r in records(run_dir)), 120, f"step {after}")
    if victim == "launcher":
        kill_launcher(proc, run_dir)
        code, out = run(cmd, tmp, timeout=300)
    else:
        rank1 = [w["pid"] for r in records(run_dir) if r["type"] == "start" for w in r["workers"] if w["rank"] == 1]
        os.kill(rank1[-1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
        code = proc.returncode
    if code != 0:
        return False, f"exited {code}"
    if any(alive(p) for p in worker_pids(run_dir)):
        return False, "a worker outlived its run"
    problem = same_as(base, run_dir, out)
    return problem is None, problem or "held"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s3", action="store_true", help="also archive to moto's S3 server and wipe the hot tier")
    ap.add_argument("--moments", default="3,9,17,28,36", help="steps after which to kill ('' for none)")
    ap.add_argument("--points", default=",".join(POINTS), help="fault points to sweep (default: all)")
    args = ap.parse_args()
    unknown = [p for p in args.points.split(",") if p and p not in POINTS]
    if unknown:  # an unknown point is never reached, and a trial that is not reached proves nothing
        ap.error(f"unknown fault point(s) {', '.join(unknown)}: choose from {', '.join(POINTS)}")
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="run-soak-"))
    (root / "base").mkdir()
    code, out = run(run_cmd(root / "base" / "run", *OPTS, steps=STEPS), root / "base")
    base = (digest(out), losses(root / "base" / "run"))
    assert code == 0 and base[0], out[-2000:]
    server = None
    archives: list[tuple[str, str | None, bool]] = [("local", str(root / "archive-{n}"), False)]
    if args.s3:
        import boto3
        from s3server import MotoServer

        server = MotoServer()
        os.environ.update(AWS_ENDPOINT_URL_S3=server.url, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                          AWS_DEFAULT_REGION="us-east-1")
        boto3.client("s3", endpoint_url=server.url).create_bucket(Bucket="soak")
        archives.append(("s3+wipe", "s3://soak/run-{n}", True))
    trials: list[tuple[str, bool, str]] = []
    n = 0
    try:
        for label, archive, wipe in archives:
            for point in [p for p in args.points.split(",") if p]:
                n += 1
                tmp = root / f"t{n}"
                tmp.mkdir()
                ok, why = point_trial(base, tmp, point, archive.format(n=n) if archive else None, wipe)
                trials.append((f"{label:8s} {point}", ok, why))
                print(f"{'HELD' if ok else 'FAIL'}  {label:8s} {point:24s} {why}", flush=True)
        for victim in ("launcher", "worker"):
            for after in (int(x) for x in args.moments.split(",") if x):
                n += 1
                tmp = root / f"t{n}"
                tmp.mkdir()
                ok, why = moment_trial(base, tmp, after, victim)
                trials.append((f"{victim} after step {after}", ok, why))
                print(f"{'HELD' if ok else 'FAIL'}  kill {victim:8s} after step {after:2d}  {why}", flush=True)
    finally:
        if server is not None:
            server.stop()
    held = sum(ok for _, ok, _ in trials)
    reached = sum(1 for _, ok, why in trials if "not reached" not in why)
    print(f"\n{held}/{len(trials)} trials held ({reached} reached their kill point) in {time.monotonic() - t0:.0f} s")
    shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if held == len(trials) else 1)


if __name__ == "__main__":
    main()
