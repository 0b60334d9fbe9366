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


def _gemm(*steady, first=None, size=8192):
    """deep.json's gemm as deep.gemm_summary writes it, from each GPU's timed windows: the steady rate in the last
    half of 8 windows and `first` (default: the steady rate) in the first."""
    from trainready.check.deep import gemm_summary

    flops = 2 * size**3
    per_gpu = []
    for i, t in enumerate(steady):
        start = first[i] if first else t
        per_gpu.append({"index": i, "device": "NVIDIA A100-SXM4-40GB", "calls": 100,
                        "window_seconds": [flops * 100 / (start if w == 0 else t) / 1e12 for w in range(8)]})
    return gemm_summary(size, per_gpu)


@pytest.mark.parametrize(("tflops", "status"), [(250.0, "pass"), (150.0, "warn"), (60.0, "fail")])
def test_gemm_judged_against_the_datasheet_peak(tmp_path, tflops, status):
    found = _deep_findings(tmp_path, "p4d", {"gemm": _gemm(*[tflops] * 8)})["gpu.matmul"]
    assert found.status == status, found
    assert found.observed.startswith(f"GPU0 {tflops:.0f}, GPU1 {tflops:.0f}")


def test_every_gpu_is_judged_against_the_best_and_against_its_own_start(tmp_path):
    """Issue 28: --deep timed GPU 0 alone for about 0.1 s, so a slow or throttling GPU 1-7 passed. Every GPU now
    runs at once for seconds; one 10% behind the best warns, 25% behind fails (Hugging Face's gpu-fryer passes a
    GPU within 10% of the best), and a steady rate 25% under its first window is named as throttling."""
    slow = _deep_findings(tmp_path / "a", "p4d", {"gemm": _gemm(250, 250, 250, 222, 250, 250, 250, 250)})
    assert slow["gpu.matmul"].status == "warn" and "GPU3 11% behind the best GPU (250)" in slow["gpu.matmul"].reason
    bad = _deep_findings(tmp_path / "b", "p4d", {"gemm": _gemm(250, 250, 250, 250, 250, 250, 250, 180)})
    assert bad["gpu.matmul"].status == "fail" and "GPU7 28% behind" in bad["gpu.matmul"].reason
    fell = _deep_findings(tmp_path / "c", "p4d", {"gemm": _gemm(*[250] * 7, 240, first=[260] * 7 + [330])})
    assert fell["gpu.matmul"].status == "warn" and "GPU7 fell from 330 to 240 under load" in fell["gpu.matmul"].reason
    old = _deep_findings(tmp_path / "d", "p4d", {"gemm": {"tflops": 250.0, "size": 8192}})
    assert old["gpu.matmul"].status == "warn" and "GPU 0 only" in old["gpu.matmul"].reason
    hostile = {"gemm": {"gpus": [{"index": True, "tflops": "fast"}, {"index": 1, "tflops": 1e300}, "x"],
                        "errors": ["GPU2: RuntimeError: CUDA error: an illegal memory access" * 20]}}
    found = _deep_findings(tmp_path / "e", "p4d", hostile)["gpu.matmul"]
    assert found.status == "fail" and "GEMM failed on GPU2" in found.reason and len(found.reason) < 400
    none = _deep_findings(tmp_path / "f", "p4d", {"gemm": {"size": 8192, "gpus": [], "errors": "boom"}})["gpu.matmul"]
    assert none.status == "fail" and none.observed == "no GPU finished its GEMM" and "boom" in none.reason


def test_the_gemm_summary_keeps_the_steady_rate_and_the_worst_gpu():
    result = _gemm(300, 200, first=[400, 200])
    assert [round(g["tflops"]) for g in result["gpus"]] == [300, 200]
    assert round(result["gpus"][0]["first_tflops"]) == 400 and round(result["tflops"]) == 200


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
