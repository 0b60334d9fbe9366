"""bench/gpu_suite.py: its dry run (the GPU suite's code paths on CPU, tiny shapes) and its refusals."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from run_helpers import env_for_run
from shared_runs import shared_result

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "bench" / "gpu_suite.py"
SECTIONS = ("gemm", "attention", "ring", "copy", "training", "checkpoint")


def suite(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SUITE), *args], capture_output=True, text=True, cwd=ROOT,
                          env=env_for_run({"CUDA_VISIBLE_DEVICES": ""}), timeout=timeout)


def load_suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_suite"] = module
    spec.loader.exec_module(module)
    return module


def numbers(value, top: bool = True):
    """(number, top-level?) for every int/float in a row (bools are flags, not figures)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, (int, float)):
        yield value, top
    elif isinstance(value, dict):
        for v in value.values():
            yield from numbers(v, False)
    elif isinstance(value, list):
        for v in value:
            yield from numbers(v, False)


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """The dry run, made once per test session whichever xdist workers its tests land on (shared_runs); its files
    stay in the session's shared folder, read and never changed by the tests."""
    def make(out: Path) -> dict:
        docs = out / "measurements.md"
        docs.write_text("# Measurements\n")
        # ten times the dry run's 60 s, each section's budget with it: the tests check what every code path gives,
        # which a busy machine must not cut short (a quiet one finishes in about 25 s, as with the default)
        proc = suite("--dry-run", "--time-budget", "600", "--out", str(out / "results"), "--write-docs",
                     "--docs-file", str(docs))
        return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "folder": str(out)}

    made = shared_result(tmp_path_factory, "gpu-suite-dry-run", make)
    proc = subprocess.CompletedProcess([str(SUITE), "--dry-run"], made["returncode"], made["stdout"], made["stderr"])
    return proc, Path(made["folder"]) / "results", Path(made["folder"]) / "measurements.md"


def test_dry_run_exits_0_and_writes_every_section(dry):
    proc, out, _docs = dry
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "gpu_suite.json").read_text())
    assert report["schema_version"] == 1 and report["kind"] == "trainready-gpu-suite" and report["dry_run"] is True
    assert report["date"] and report["host"]["torch"] == torch.__version__ and "cuda" in report["host"]
    assert report["failed_sections"] == []
    assert 0 < report["wall_s"] < 600 and report["budgets_s"]["total"] == 600
    assert report["budgets_s"]["attention"] == 80  # the dry run's 8 s, scaled with the total
    for name in SECTIONS:
        sec = report["sections"][name]
        assert sec["status"] == "ok", (name, sec.get("error"), sec.get("errors"))
        assert sec["rows"], name
        assert sec["units"], name
        assert not sec["errors"], (name, sec["errors"])
        for row in sec["rows"]:
            for x, top in numbers(row):
                assert math.isfinite(x), (name, row)
                if top:
                    assert x > 0, (name, row)
        for skip in sec["skipped"]:
            assert skip["what"] and skip["reason"], (name, skip)
    # the scratch checkpoint directory is gone; the run directory stays
    assert not (out / "ckpt-scratch").exists()
    assert (out / "train-run" / "telemetry.jsonl").exists()


def test_dry_run_sections_hold_what_they_stand_for(dry):
    _proc, out, _docs = dry
    sec = json.loads((out / "gpu_suite.json").read_text())["sections"]
    gemm = sec["gemm"]["rows"]
    assert {r["dtype"] for r in gemm} >= {"bf16"}
    fp8 = [r for r in gemm if r["dtype"] == "fp8"]
    assert fp8 or any(s["what"] == "FP8 GEMMs" for s in sec["gemm"]["skipped"])
    models = {r["model"] for r in gemm}
    # each model's shapes measured, or (on a busy machine: the dry run's 10 s section budget) recorded as left out
    left_out = {s["what"] for s in sec["gemm"]["skipped"] if "section time budget" in s["reason"]}
    for model in ("llama-3.1-8b", "llama-3-70b (TP8 shard)", "qwen3-30b-a3b"):
        assert model in models or any(what.startswith(f"{model} ") for what in left_out), (model, sec["gemm"])
    assert "reference" in models  # the first shape is always measured: the budget is checked before each one
    grouped = [r for r in gemm if "experts" in r]
    assert {r["method"] for r in grouped} >= {"loop"}
    if not any(r["method"] == "grouped_mm" for r in grouped):  # this torch lacks it: said why
        assert any(s["what"] == "torch._grouped_mm" for s in sec["gemm"]["skipped"])
    attention = sec["attention"]["rows"]
    assert len(attention) >= 3 and len({r["seq"] for r in attention}) == len(attention)
    ring = sec["ring"]["rows"]
    assert [r["cp"] for r in ring] == [2, 4] and all(r["seq"] == r["cp"] * r["local_tokens"] for r in ring)
    assert all(r["rank"] == r["cp"] // 2 and r["seconds"] == r["forward_s"] + r["backward_s"] for r in ring)
    copies = sec["copy"]["rows"]
    assert {r["direction"] for r in copies} == {"H2D", "D2H", "D2D"}
    # the dry run never uses a GPU: pinned host memory is a recorded skip
    assert any("pinned" in s["what"] and "CUDA" in s["reason"] for s in sec["copy"]["skipped"])
    (train,) = sec["training"]["rows"]
    assert train["run_status"] == "finished" and train["steps_logged"] == 3 and train["steps"] == 3
    assert train["tokens_per_s"] > 0 and train["telemetry_tokens_per_s"] > 0 and train["peak_host_rss_gib"] > 0
    ckpt = {r["what"]: r for r in sec["checkpoint"]["rows"]}
    restore = next(r for w, r in ckpt.items() if w.startswith("restore"))
    assert restore["bit_exact"] is True and restore["tensors_compared"] > 0
    assert any(w.startswith("save") for w in ckpt) and any(w.startswith("async save") for w in ckpt)


def test_dry_run_markdown(dry):
    proc, out, docs = dry
    md = (out / "gpu_suite.md").read_text()
    for header in ("| model | GEMM | M x K x N |", "| seq | batch |", "| cp | seq | tokens per rank |",
                   "| direction | host memory |",
                   "| model | params | micro-batch x seq |", "| operation | GiB | seconds |"):
        assert header in md, header
    assert "Dry run on CPU" in md
    assert md.strip() in proc.stdout  # printed
    assert docs.read_text() == "# Measurements\n" + "\n" + md  # --write-docs appended it to --docs-file


def test_dry_run_write_docs_needs_an_explicit_file(tmp_path):
    proc = suite("--dry-run", "--out", str(tmp_path), "--write-docs", timeout=60)
    assert proc.returncode == 2 and "--docs-file" in proc.stderr
    assert not (tmp_path / "gpu_suite.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: the suite would run")
def test_without_cuda_it_exits_2(tmp_path):
    proc = suite("--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device; use --dry-run" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_calibration_goes_through_the_projects_files(tmp_path, catalog):
    """The calibration a GPU run writes is one `--calibration FILE` reads. The figures here are made up
    inputs for the code path (a GPU run passes its own measurements)."""
    from trainready.plan import calibration_file as cf

    gs = load_suite()
    summary = gs.build_calibration("h100-80gb", {"k": 8192, "tflops": 650.0}, {"gbps": 2500.0}, None, None,
                                   tmp_path / "gpu_suite.json", tmp_path / "calibration.json")
    cal = cf.load(str(tmp_path / "calibration.json"), catalog)
    assert cal.gpu == "h100-80gb" and cal.name == summary["name"] and cal.stack is None
    assert cal.factors["gemm"].status == "informed" and cal.factors["gemm"].value < cal.factors["gemm"].prior
    assert cal.factors["attention"].status == "not informed"
    assert summary["factors"]["memory"]["status"] == "informed"


def test_markdown_of_a_gpu_run_names_the_machine(dry):
    """The GPU branch of the Markdown (header with GPU, driver, torch/CUDA) renders; host facts made up here."""
    _proc, out, _docs = dry
    gs = load_suite()
    report = json.loads((out / "gpu_suite.json").read_text())
    report["dry_run"] = False
    report["host"].update(gpu="NVIDIA H100 80GB HBM3", driver="550.54.15", capability="9.0", gpu_memory_gib=79.2,
                          nvidia_smi={"memory_total_mib": 81559.0, "power_limit_w": 700.0, "max_sm_clock_mhz": 1980.0})
    md = gs.render_markdown(report)
    assert md.startswith(f"### GPU suite: NVIDIA H100 80GB HBM3 ({report['date']})")
    assert "driver 550.54.15" in md and f"PyTorch {torch.__version__}" in md and "81,559 MiB" in md
    assert "Dry run" not in md


def load_ring():
    spec = importlib.util.spec_from_file_location("gpu_suite_ring", ROOT / "bench" / "gpu_suite_ring.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_suite_ring"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_the_ring_steps_add_up_to_causal_attention_on_every_rank(cp):
    """What the ring section times is what the load-balanced ring computes: on every rank, its steps merged give
    causal attention of the whole sequence for the rank's two chunks (rank r holds chunks r and 2cp-1-r, and
    step i brings the keys and values of rank r - i)."""
    ring = load_ring()
    torch.manual_seed(0)
    local, heads, hd = 16, 2, 8
    seq, c = cp * local, local // 2
    q, k, v = (torch.randn(1, heads, seq, hd) for _ in range(3))
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def held(x, r):
        return torch.cat([x[:, :, r * c:(r + 1) * c], x[:, :, (2 * cp - 1 - r) * c:(2 * cp - r) * c]], dim=2)

    forward, _backward = ring.flash_ops(False)
    for r in range(cp):
        out = lse = None
        for i, (q_part, kv_part, causal) in enumerate(ring.steps(r, cp)):
            src = (r - i) % cp
            o, l_b, _ = forward(ring._half(held(q, r), q_part), ring._half(held(k, src), kv_part),
                                ring._half(held(v, src), kv_part), causal)
            o, l_b = o.float(), l_b.float().unsqueeze(-1)
            if out is None:
                out, lse = o, l_b
                continue
            cur_o, cur_l = ring._half(out, q_part), ring._half(lse, q_part)
            new_o = cur_o - torch.sigmoid(l_b - cur_l) * (cur_o - o)
            new_l = cur_l - torch.nn.functional.logsigmoid(cur_l - l_b)
            out, lse = ring._put_half(out, q_part, new_o), ring._put_half(lse, q_part, new_l)
        assert torch.allclose(out, held(whole, r), atol=1e-5), (cp, r)
    # and the timed object runs the same plan forward and backward
    rank = ring.RingRank(local, heads, hd, cp // 2, cp, "cpu")
    out, lse, ctxs = rank.forward()
    assert out.shape == rank.q.shape and lse.shape == rank.q.shape[:3]
    grads = rank.backward(out, lse, ctxs)
    assert [g.shape for g in grads] == [rank.q.shape] * 3 and all(torch.isfinite(g.float()).all() for g in grads)


@pytest.mark.parametrize("r", [0, 1])
def test_the_ring_backward_gives_the_query_gradients_of_causal_attention(r):
    """With two ranks a rank meets one other rank's keys and values, so the timed object, given the real chunks,
    must give autograd's query gradient for its chunks (the key and value gradients travel on to other ranks)."""
    ring = load_ring()
    torch.manual_seed(1)
    cp, local, heads, hd = 2, 16, 2, 8
    seq, c = cp * local, local // 2
    q, k, v = (torch.randn(1, heads, seq, hd, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, heads, seq, hd)
    (dq_whole,) = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                                      (q,), grad)

    def held(x, rank):
        x = x.detach()
        return torch.cat([x[:, :, rank * c:(rank + 1) * c], x[:, :, (2 * cp - 1 - rank) * c:(2 * cp - rank) * c]], 2)

    rank = ring.RingRank(local, heads, hd, r, cp, "cpu")
    rank.q, rank.k, rank.v, rank.grad = held(q, r), held(k, r), held(v, r), held(grad, r)
    rank.k_other, rank.v_other = held(k, 1 - r), held(v, 1 - r)
    out, lse, ctxs = rank.forward()
    dq, _dk, _dv = rank.backward(out, lse, ctxs)
    assert torch.allclose(dq, held(dq_whole, r).to(dq.dtype), atol=1e-4), r


def test_clocks_under_load_are_sampled_while_the_gemm_runs_and_reported(dry, monkeypatch):
    module = load_suite()
    asked = []

    def smi(fields, timeout=20):  # an older driver: no clocks_event_reasons, the throttle name instead
        asked.append(fields)
        if "clocks_event_reasons" in fields:
            return "nvidia-smi exit 2: Field \"clocks_event_reasons.active\" is not a valid field to query."
        return ["1410", "498.7", "61", "0x0000000000000004"]

    calls = []
    monkeypatch.setattr(module, "_smi_query", smi)
    monkeypatch.setattr(module.torch.cuda, "synchronize", lambda: None)
    sample = module.under_load(lambda: calls.append(1), True, 0.2)
    assert sample == {"sm_clock_mhz": 1410.0, "power_draw_w": 498.7, "temperature_c": 61.0,
                      "clock_event_reasons": "0x0000000000000004"}
    assert len(asked) == 2 and calls  # the GPU was kept busy while it was read
    assert module.under_load(lambda: None, False, 0.2) == {"skipped": "no GPU"}

    _proc, out, _docs = dry
    report = json.loads((out / "gpu_suite.json").read_text())
    report["dry_run"] = False
    report["wall_s"] = 1.0
    report["host"].update(gpu="NVIDIA H100 80GB HBM3", capability="9.0", driver="550.54.15",
                          nvidia_smi={"power_limit_w": 500.0, "max_sm_clock_mhz": 1980.0, "memory_total_mib": 81559})
    ref = next(r for r in report["sections"]["gemm"]["rows"] if r["model"] == "reference" and r["dtype"] == "bf16")
    ref["under_load"] = sample
    md = module.render_markdown(report)
    assert "SM clock 1,410 MHz (max 1980), power 499 W of its 500 W limit, temperature 61 C" in md, md[:2000]
    assert "`0x0000000000000004`" in md
    ref["under_load"] = {**sample, "power_draw_w": None}  # nvidia-smi's [N/A]: said, not dropped
    assert "power not reported of its 500 W limit" in module.render_markdown(report)

    def hung(fields, timeout=20):  # nvidia-smi that never answers: bounded, and said
        asked.append(timeout)
        time.sleep(1.0)
        return "TimeoutExpired: nvidia-smi"

    asked.clear()
    monkeypatch.setattr(module, "_smi_query", hung)
    t0 = time.monotonic()
    late = module.under_load(lambda: None, True, 0.2)
    assert time.monotonic() - t0 < 5 and asked == [5]  # no retry under the older field name after a timeout
    assert late == {"error": "TimeoutExpired: nvidia-smi"}
