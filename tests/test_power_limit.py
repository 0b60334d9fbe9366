"""GPUs held below their rated board power (--power-limit): the published pairs the scale comes from, what it slows
and what it leaves, the usage errors where no evidence covers it, plan's exclusions, job files, and the bench rows
whose sources state a limit."""

import csv
import json
from pathlib import Path

import pytest
from bench_modules import bench_module
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan import efficiency as eff
from trainready.plan.job import JobSpec
from trainready.plan.memory import estimate_memory
from trainready.plan.performance import estimate_step
from trainready.plan.setup import resolve

ROOT = Path(__file__).resolve().parents[1]
H100 = dict(model="llama-3.1-8b", gpu="h100-80gb", gpus=8, micro_batch=1, global_batch=64, seq_len=4096)


def test_the_scale_runs_through_the_published_pairs():
    assert eff.power_scale("hopper", 700, 700) == 1.0
    assert eff.power_scale("hopper", 400, 700) == pytest.approx(835 / 989)  # H100 NVL against H100 SXM
    assert eff.power_scale("blackwell", 700, 1000) == pytest.approx(1750 / 2250)  # B100 against HGX B200
    caps = [eff.power_scale("hopper", w, 700) for w in range(400, 701, 50)]
    assert caps == sorted(caps) and len(set(caps)) == len(caps)  # more watts, more compute
    # the Blackwell line, run from GB200's 1,200 W down to HGX B200's 1,000 W, lands within 3% of their datasheets
    assert eff.power_scale("blackwell", 1000, 1200) == pytest.approx(2250 / 2500, rel=0.03)


@pytest.mark.parametrize("arch, watts, rated, said", [
    ("hopper", 300, 700, "outside 400-700 W"), ("hopper", 800, 700, "outside 400-700 W"),
    ("blackwell", 600, 1000, "outside 700-1000 W"), ("ampere", 300, 400, "not modelled on ampere"),
    ("hopper", 500, None, "rated board power is not in the catalog")])
def test_limits_no_evidence_covers_are_refused(arch, watts, rated, said):
    with pytest.raises(ValueError, match=said):
        eff.power_scale(arch, watts, rated)


def test_a_cap_slows_compute_only(catalog):
    full, capped = resolve(JobSpec(**H100), catalog), resolve(JobSpec(**H100, power_limit_w=500), catalog)
    scale = capped.power_scale
    assert scale == pytest.approx(eff.power_scale("hopper", 500, 700)) and full.power_scale == 1.0
    a, b = estimate_step(full), estimate_step(capped)
    # GEMMs and attention take 1/scale as long, elementwise kernels and links no longer: between the two
    assert a.step_s < b.step_s < a.step_s / scale
    assert b.mfu / a.mfu == pytest.approx(b.tokens_per_s / a.tokens_per_s)  # MFU stays against the rated peak
    assert estimate_memory(full).peak == estimate_memory(capped).peak


@pytest.mark.parametrize("arch", ["hopper", "blackwell"])  # the architectures a cap is modelled on
def test_a_cap_slows_attention_given_as_a_rate(arch):
    """FlashAttention-2 (or -1) on Hopper and Blackwell is an A100 rate scaled by SM count x clock, not a fraction
    of the GPU's peak: the cap's lower clock must reach it as it reaches the architecture's own kernels."""
    e = eff.arch_efficiency(arch)
    capped = eff.power_capped(e, 0.9)
    for kernel in ("sdpa", "flash2", "flash1"):
        full, slow = (eff.attention_factors(x, arch, kernel, 989.0) for x in (e, capped))
        assert slow[0] == pytest.approx(0.9 * full[0]) and slow[1] == full[1], kernel


def test_a_cap_slows_fp32_adapter_matmuls(catalog):
    """PEFT's fp32 adapters (without autocast) run at the fp32 peak, a rate of its own: a cap slows those matmuls, not
    their bytes."""
    from trainready.plan.performance import _adapter_time
    s = resolve(JobSpec(**H100, method="lora", autocast=False, strategy="ddp"), catalog)
    assert s.lora_copy_bytes == 4
    e = eff.arch_efficiency("hopper")
    peak = s.gpu.peak_tflops("bf16") * 1e12
    full, slow = (_adapter_time(s, 4096, peak, x) for x in (e, eff.power_capped(e, 0.9)))
    rate = s.gpu.peak_tflops("fp32") * 1e12 * 0.9
    flops_fwd = full[2] / 3
    assert slow[0] - full[0] == pytest.approx(flops_fwd / rate * (1 / 0.9 - 1))
    assert slow[1] - full[1] == pytest.approx(2 * flops_fwd / rate * (1 / 0.9 - 1))


def test_resolve_names_the_range(catalog):
    with pytest.raises(UsageError, match=r"--power-limit 300 on h100-80gb: 300 W is outside 400-700 W"):
        resolve(JobSpec(**H100, power_limit_w=300), catalog)
    with pytest.raises(UsageError, match="not modelled on ampere"):
        resolve(JobSpec(**{**H100, "gpu": "a100-80gb"}, power_limit_w=300), catalog)


def test_estimate_says_the_cap_and_writes_it(tmp_path):
    r = cli_run("estimate", "-m", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus", "8", "--power-limit", "500",
                "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    setup = json.loads(r.stdout)["setup"]
    assert setup["power_limit_w"] == 500 and 0.85 < setup["power_scale"] < 0.95
    r = cli_run("estimate", "-m", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus", "8", "--power-limit", "500")
    assert "capped at 500 W (90% of rated compute)" in r.stdout
    for bad, said in (("300", "outside 400-700 W"), ("0", "above 0")):
        r = cli_run("estimate", "-m", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus", "8", "--power-limit", bad)
        assert r.returncode == 2 and said in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr


def test_a_job_file_keeps_its_cap_for_its_own_gpu(tmp_path):
    job = tmp_path / "job.toml"
    r = cli_run("estimate", "-m", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus", "8", "--power-limit", "500",
                "--save", str(job))
    assert r.returncode == 0, r.stdout + r.stderr
    kept = json.loads(cli_run("estimate", "--job", str(job), "--json").stdout)["setup"]
    assert kept["power_limit_w"] == 500
    # its watts were the H100's: another GPU named here drops them (500 W would be outside a B200's range), an
    # instance of the same GPU keeps them
    other = cli_run("estimate", "--job", str(job), "--gpu", "b200", "--json")
    assert other.returncode == 0, other.stdout + other.stderr
    assert json.loads(other.stdout)["setup"]["power_limit_w"] is None
    same = json.loads(cli_run("estimate", "--job", str(job), "--instance", "p5.48xlarge", "--json").stdout)
    assert same["setup"]["power_limit_w"] == 500
    # plan searches every GPU: the file's watts are not applied, and it says so
    plan = json.loads(cli_run("plan", "--job", str(job), "--tokens", "1e9", "--json").stdout)
    assert all(row["estimate"]["setup"]["power_limit_w"] is None for row in plan["rows"])
    assert any("power limit (500 W) was for its own GPU" in n for n in plan["notes"])


def test_plan_excludes_what_the_cap_cannot_be_modelled_on():
    r = cli_run("plan", "-m", "llama-3.1-8b", "--tokens", "1e9", "--power-limit", "500", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["rows"] and all(row["estimate"]["setup"]["power_limit_w"] == 500 for row in out["rows"])
    assert all(row["estimate"]["setup"]["power_scale"] < 1 for row in out["rows"])
    reasons = {e["instance"]: e["reason"] for e in out["excluded"]}
    assert any("not modelled on ampere" in why for why in reasons.values())
    assert any("outside 700-1000 W" in why for why in reasons.values())  # B200 nodes: 500 W is below B100's
    assert any("GPUs capped at 500 W" in n for n in out["notes"])




def test_the_bench_reads_the_limits_and_parts_its_sources_state():
    b = bench_module("plan_accuracy_2024")
    rows = {r["id"]: r for name in b.FILES for r in csv.DictReader((b.DATA / name).open(newline=""))}
    meta = b.job_of(rows["titan24-8b-fsdp8-compile"])  # "96GB HBM2e ... 500 W power limit"
    assert meta.power_limit_w == 500 and meta.gpu == "h100-96gb-hbm2e"
    assert b.CATALOG.gpus["h100-96gb-hbm2e"].hbm_gbps == 2400
    assert b.job_of(rows["titan-mx-b200-8b-bf16"]).power_limit_w == 750  # "B200 power limit 750 W"
    nvidia = b.job_of(rows["mbridge-llama3-8b-b200-fp8cs"])
    assert nvidia.power_limit_w is None and nvidia.gpu == "b200"


FIXTURE = ROOT / "tests" / "fixtures" / "real" / "nvsmi" / "nvidia-smi-q-d-power_H100-700W-held-at-500W_stackhpc975.txt"


def _power_finding(text: str, instance: str | None = None):
    from trainready.check.analyze import analyze
    from trainready.check.bundle import Bundle

    files = {"nvidia-smi-q.txt": text}
    if instance:
        files["instance-type.txt"] = instance + "\n"
    return next(c for c in analyze(Bundle(files, None, source="t")).checks if c.id == "gpu.power-limit")


def test_check_tells_a_platform_cap_from_a_driver_setting():
    text = "".join(line for line in FIXTURE.read_text().splitlines(keepends=True) if not line.startswith("# "))
    capped = _power_finding(text, "p5.48xlarge")  # the real output: 700 W asked, 500 W in force
    assert capped.status == "warn" and "500 of 700 W" in capped.observed
    assert "platform caps them" in capped.reason and "cannot lift it" in capped.advice
    assert "on h100-80gb the planner's model keeps 90% of the rated GEMM and attention speed at 500 W" in capped.reason
    # the same GPU after `nvidia-smi -pl 500` (Requested follows): the driver's setting, which -pl undoes
    set_low = text.replace("Requested Power Limit                          : 700.00 W",
                           "Requested Power Limit                          : 500.00 W")
    assert set_low != text
    by_pl = _power_finding(set_low)
    assert by_pl.status == "warn" and "nvidia-smi -pl 700" in by_pl.advice and "platform" not in by_pl.reason
    at_default = _power_finding(text.replace("Current Power Limit                            : 500.00 W",
                                             "Current Power Limit                            : 700.00 W"))
    assert at_default.status == "pass"


def _q(*gpus: tuple[str, str, str]) -> str:
    """An nvidia-smi -q power section for GPUs given as (current, requested, default) values."""
    out = "==============NVSMI LOG==============\n\nAttached GPUs : %d\n" % len(gpus)
    for i, (cur, req, dflt) in enumerate(gpus):
        out += (f"GPU 00000000:{i + 10:02X}:00.0\n    GPU Power Readings\n"
                f"        Current Power Limit               : {cur}\n"
                f"        Requested Power Limit             : {req}\n"
                f"        Default Power Limit               : {dflt}\n")
    return out


def test_check_readings_that_are_not_readings_are_unknown():
    assert _power_finding(_q(("0.00 W", "700.00 W", "700.00 W"))).status == "skip"
    assert _power_finding(_q(("500.00 W", "500.00 W", "0.00 W"))).status == "skip"
    assert _power_finding(_q(("N/A", "N/A", "700.00 W"))).status == "skip"
    above = _power_finding(_q(("800.00 W", "800.00 W", "700.00 W")))
    assert above.status == "pass" and "800 W in force, default 700 W" in above.observed  # never "the default"


def test_check_quotes_the_most_capped_gpu_and_each_cause():
    mixed = _power_finding(_q(("600.00 W", "600.00 W", "700.00 W"), ("450.00 W", "700.00 W", "700.00 W")),
                           "p5.48xlarge")
    assert mixed.status == "warn"
    assert "GPU 1 held below the limit nvidia-smi asked for" in mixed.reason  # the platform's cap
    assert "GPU 0 set below their default power limit (nvidia-smi -pl)" in mixed.reason
    assert "at 450 W (trainready estimate --power-limit 450)" in mixed.reason  # the slowest GPU sets the pace
    assert "GPU 1: nvidia-smi -pl cannot lift it" in mixed.advice and "GPU 0: sudo nvidia-smi -pl 700" in mixed.advice


def test_plan_says_the_range_when_the_limit_excludes_everything():
    r = cli_run("plan", "-m", "llama-3.1-8b", "--tokens", "1e9", "--power-limit", "100", "--json")
    assert r.returncode == 1 and not json.loads(r.stdout)["rows"]
    said = [n for n in json.loads(r.stdout)["notes"] if "excluded every instance" in n]
    # each GPU's range from its rated power in the catalog: 57% of H100's 700 W, 70% of B200's 1,000 W
    assert said and "h100-80gb 400-700 W" in said[0] and "b200 700-1000 W" in said[0]
