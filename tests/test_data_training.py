"""trainready.data feeding a real training run: examples/tiny_gpt.py --data on 2 gloo processes,
through `trainready run`, from shards on the local S3 server. The loader's state is in every
checkpoint, so a run SIGKILLed mid-epoch (across epoch boundaries too) and restarted ends
exactly like one never interrupted; and the run reports its data wait."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from run_helpers import TINY_GPT, digest, env_for_run, kill_launcher, records, run, run_cmd, start, wait_for

STEPS = 30  # 100 sequences per rank / batch 8 = 12 steps per epoch: the run crosses 2 epoch boundaries
OPTS = ("--nproc-per-node", "2", "--ckpt-every", "5")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, moto):
    """200 sequences of the tiny corpus, packed into 4 shards on the moto server."""
    import subprocess

    import boto3

    src = tmp_path_factory.mktemp("corpus")
    env = env_for_run({"AWS_ENDPOINT_URL_S3": moto.url, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing-secret", "AWS_DEFAULT_REGION": "us-east-1"})
    subprocess.run([sys.executable, str(TINY_GPT), "--write-corpus", str(src)], env=env, check=True, capture_output=True)
    rows = np.load(src / "corpus.npy")[:200]
    np.save(src / "corpus.npy", rows)
    boto3.client("s3", endpoint_url=moto.url, aws_access_key_id="testing", aws_secret_access_key="testing-secret",
                 region_name="us-east-1").create_bucket(Bucket="tiny-data")
    out = subprocess.run([sys.executable, "-m", "trainready", "data", "pack", str(src), "--format", "tokens",
                          "--out", "s3://tiny-data/tiny", "--shard-size", "60KiB", "--json"],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["shards_total"] >= 3
    return "s3://tiny-data/tiny", env


def _cmd(run_dir, url, cache):
    return run_cmd(run_dir, *OPTS, steps=STEPS, script_args=("--data", url, "--data-workers", "1"))


def test_streamed_training_resumes_exactly(dataset, tmp_path):
    url, env = dataset
    env = {**env, "TMPDIR": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}  # the shard cache lives here
    base_dir = tmp_path / "base"
    code, out = run(_cmd(base_dir, url, tmp_path), tmp_path, env)
    assert code == 0, out[-3000:]
    want = digest(out)
    base = {r["step"]: r["metrics"]["loss"] for r in records(base_dir) if r["type"] == "step"}
    assert sorted(base) == list(range(STEPS))

    run_dir = tmp_path / "killed"
    proc = start(_cmd(run_dir, url, tmp_path), tmp_path, env)
    wait_for(lambda: any(r["type"] == "step" and r["step"] >= 17 for r in records(run_dir)), 120, "step 17")
    kill_launcher(proc, run_dir)  # mid-epoch 2, after the first boundary
    code, out = run(_cmd(run_dir, url, tmp_path), tmp_path, env)
    assert code == 0, out[-3000:]
    assert digest(out) == want
    for r in records(run_dir):
        if r["type"] == "step":
            assert r["metrics"]["loss"] == base[r["step"]], r
    summary = json.loads((run_dir / "summary.json").read_text())
    # measured and reported (here large: 12-step epochs each start a loader worker); bench/data_bench.py
    # reports the figure for a long epoch
    assert 0 < summary["shares"]["data"] < 1
