"""Soak: SIGKILL a real training process at every named fault point, on several hits, with
sync and async saves (and S3 when --s3), then check that the next run restores a committed
checkpoint holding exactly that step's state and ends where the uninterrupted run ends.

    .venv/bin/python bench/ckpt_soak.py            # local archive, every point x hits 1-3 x sync/async
    .venv/bin/python bench/ckpt_soak.py --s3       # also through moto's S3 server

Prints one line per trial and how many held; exit 1 if any did not."""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import ckpt_worker as job  # noqa: E402
from store_helpers import result, run_job  # noqa: E402

from trainready.store.faults import POINTS  # noqa: E402

PRE_COMMIT = ("save.staged", "hot.data_written", "hot.manifest_written")
HOT_COMMITTED = ("hot.renamed", "hot.committed")


def trial(base: Path, archive: str, point: str, hit: int, mode: str, refs: dict[int, str]) -> tuple[bool, str]:
    hot = base / "hot"
    args = ["--hot", str(hot), "--archive", archive, "--keep-hot", "2"]
    flags = ["--sync", "--wait-each"] if mode == "sync" else []
    if point == "restore.downloaded":  # a new node: the faulted run restores from the archive
        if run_job([*args, *flags, "--steps", str(2 + hit)]) != [0]:
            return False, "preparing run failed"
        shutil.rmtree(hot)
    codes = run_job([*args, *flags, "--steps", "5"], env={"TRAINREADY_FAULT": f"{point}#{hit}"})
    if codes != [-9]:
        return True, "point not reached (nothing to check)"
    out = base / "out.json"
    if run_job([*args, "--steps", "7", "--out", str(out)]) != [0]:
        return False, "resume run failed"
    res = result(out)
    step = res["restored"]
    # the last good checkpoint is never lost: every save before the killed one is restorable
    least = hit - 1 if point in PRE_COMMIT else hit if point in HOT_COMMITTED else 1
    if point == "restore.downloaded":
        least = 2 + hit
    if (step or 0) < least:
        return False, f"restored {step}, but step {least} had been committed"
    if step is None:
        return True, "restored nothing (nothing had been committed)"
    for s in (step, 7):
        refs.setdefault(s, job.reference_digest(s))
    if res["restored_digest"] != refs[step]:
        return False, f"restored step {step} holds other values"
    if res["digest"] != refs[7]:
        return False, "resumed run diverged"
    return True, f"restored step {step} from {res['tier']}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s3", action="store_true", help="also run every trial against a local moto S3 server")
    ap.add_argument("--hits", type=int, default=3)
    args = ap.parse_args()
    archives = ["local"] + (["s3"] if args.s3 else [])
    server = None
    if args.s3:
        import boto3
        from s3server import MotoServer

        server = MotoServer()
        os.environ.update(AWS_ENDPOINT_URL_S3=server.url, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                          AWS_DEFAULT_REGION="us-east-1")
        boto3.client("s3", endpoint_url=server.url).create_bucket(Bucket="soak")
    refs: dict[int, str] = {}
    held = total = unreached = 0
    started = time.monotonic()
    try:
        for n, (where, point, hit, mode) in enumerate(itertools.product(archives, POINTS, range(1, args.hits + 1),
                                                                         ("sync", "async"))):
            base = Path(tempfile.mkdtemp(prefix="soak-"))
            archive = str(base / "archive") if where == "local" else f"s3://soak/trial-{n}"
            ok, why = trial(base, archive, point, hit, mode, refs)
            shutil.rmtree(base, ignore_errors=True)
            total += 1
            held += ok
            unreached += why.startswith("point not reached")
            print(f"{'held ' if ok else 'FAILED'} {where:5} {point:24} hit {hit} {mode:5}  {why}", flush=True)
    finally:
        if server is not None:
            server.stop()
    print(f"\n{held}/{total} trials held ({time.monotonic() - started:.0f} s): {total - unreached} killed a process at "
          f"its point, {unreached} never reached it (e.g. a restore downloads once, so its 2nd hit never comes)")
    return 0 if held == total else 1


if __name__ == "__main__":
    sys.exit(main())
