"""`check --deep`: measurements judged against the catalog, the CPU analogue (gloo), storage
bandwidth, and the multi-node form under torchrun (two local processes over gloo)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from check_bundles import make_bundle

from trainready.check.analyze import analyze
from trainready.check.bundle import Bundle
from trainready.check.deep import allreduce_local, storage_bandwidth


def _deep_findings(tmp_path, kind, deep):
    directory = make_bundle(kind, tmp_path, replace={"deep.json": json.dumps(deep)})
    report = analyze(Bundle.load(directory), deep=True)
    return {f.id: f for f in report.checks}


@pytest.mark.parametrize(("busbw", "status"), [(235.0, "pass"), (120.0, "warn"), (40.0, "fail")])
def test_allreduce_judged_against_nvswitch_expectation(tmp_path, busbw, status):
    deep = {"allreduce": {"backend": "nccl", "world_size": 8, "busbw_gbps": busbw, "rows": []}}
    found = _deep_findings(tmp_path, "p4d", deep)["nccl.allreduce"]
    assert found.status == status, found
    assert "228" in found.expected and "aznhc" in found.expected  # Azure's healthy-node floor for 8x A100 (issue 16)


@pytest.mark.parametrize(("tflops", "status"), [(250.0, "pass"), (150.0, "warn"), (60.0, "fail")])
def test_gemm_judged_against_the_datasheet_peak(tmp_path, tflops, status):
    found = _deep_findings(tmp_path, "p4d", {"gemm": {"tflops": tflops, "size": 8192}})["gpu.matmul"]
    assert found.status == status, found


def test_deep_checks_skip_with_a_reason_without_measurements(tmp_path):
    found = _deep_findings(tmp_path, "p4d", {"gemm": {"skipped": "no CUDA device"}})
    assert found["gpu.matmul"].status == "skip" and "no CUDA" in found["gpu.matmul"].reason
    assert found["nccl.allreduce"].status == "skip" and found["storage.hot-tier-bandwidth"].status == "skip"
    quick = {f.id: f for f in analyze(Bundle.load(make_bundle("p4d", tmp_path))).checks}
    assert quick["gpu.matmul"].status == "skip" and "--deep" in quick["gpu.matmul"].reason


def test_gloo_allreduce_is_the_cpu_analogue_and_not_judged():
    result = allreduce_local(max_mib=4)
    assert result["backend"] == "gloo" and result["world_size"] == 2
    sizes = [r["size_bytes"] for r in result["rows"]]
    assert sizes == [1 << 20, 2 << 20, 4 << 20]
    for row in result["rows"]:  # nccl-tests' definitions: busbw = algbw x 2(n-1)/n
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (2 - 1) / 2)
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / (row["time_us"] / 1e6) / 1e9)


def test_storage_bandwidth_writes_reads_and_cleans_up(tmp_path):
    result = storage_bandwidth(tmp_path, size_mib=32)
    assert result["bytes"] == 32 << 20 and result["write_gbps"] > 0 and result["read_gbps"] > 0
    assert list(tmp_path.iterdir()) == []
    assert "skipped" in storage_bandwidth(tmp_path / "absent")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="measures the CPU analogue (gloo); a GPU node uses NCCL")
def test_deep_under_torchrun_measures_the_whole_world(tmp_path):
    env = {**os.environ, "TRAINREADY_NO_IMDS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "trainready", "check", "--deep", "--cpu-only", "--hot-dir", str(tmp_path), "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    # a CPU-only machine said to be one: nothing fails (the gloo figure is reported, not judged)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)  # only rank 0 prints
    found = {c["id"]: c for c in report["checks"]}
    assert report["summary"]["fail"] == 0
    assert found["nccl.allreduce"]["status"] == "skip" and "gloo, 2 ranks" in found["nccl.allreduce"]["observed"]
    hot = found["storage.hot-tier-bandwidth"]  # the speed of this disk decides pass or warn: both name it
    assert f"on {tmp_path}" in hot["observed"] and hot["status"] == ("pass" if "fast enough" in hot["reason"] else "warn")
    assert list(tmp_path.iterdir()) == []


def test_deep_reports_progress_per_measurement(tmp_path, monkeypatch):
    from contextlib import contextmanager

    from trainready.check import deep
    from trainready.cli import check_cmd

    shown = []

    @contextmanager
    def recorder(description, *, total=None, as_json=False, unit="items"):
        shown.append([description, total, as_json, 0])

        class Sink:
            def advance(self, amount=1):
                shown[-1][3] += amount
        yield Sink()

    from trainready.check.runner import add_deep

    monkeypatch.setattr(check_cmd, "progress", recorder)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(deep, "gemm", lambda: {"skipped": "test"})
    monkeypatch.setattr(deep, "allreduce_local", lambda: {"skipped": "test"})
    monkeypatch.setattr(deep, "collectives_local", lambda plan=None: {})  # no gloo processes: progress only
    bundle = Bundle({}, source="live")
    assert add_deep(bundle, tmp_path, None, check_cmd._progress(False)) == 0
    assert shown == [["measuring (--deep): GEMM, all-reduce, hot tier", 3, False, 3]]
    assert json.loads(bundle.files["deep.json"])["hot_tier"]["directory"] == str(tmp_path)
    shown.clear()
    add_deep(bundle, None, None, check_cmd._progress(True))  # --json: the progress helper is told to stay silent
    assert shown == [["measuring (--deep): GEMM, all-reduce", 2, True, 2]]
