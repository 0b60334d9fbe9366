"""The `trainready` command end to end: output, JSON, exit codes, errors without tracebacks."""

import json
import subprocess
import sys

import pytest


def cli(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "trainready", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    return proc


def test_help_and_version():
    assert cli("--help").returncode == 0
    assert cli("--version").stdout.startswith("trainready ")
    for cmd in ("plan", "estimate", "catalog"):
        out = cli(cmd, "--help")
        assert out.returncode == 0 and "Usage" in out.stdout


def test_catalog_json():
    data = json.loads(cli("catalog", "instances", "--json").stdout)
    assert data["schema_version"] == 1 and len(data["instances"]) >= 25
    p4d = next(i for i in data["instances"] if i["name"] == "p4d.24xlarge")
    assert p4d["expected_nvlink"][0][1] == 12 and p4d["source"]
    gpus = json.loads(cli("catalog", "gpus", "--json").stdout)["gpus"]
    assert {g["name"] for g in gpus} >= {"a100-40gb", "h100-80gb", "h200", "b200", "l40s"}
    models = json.loads(cli("catalog", "models", "--json").stdout)["models"]
    assert any(m["name"] == "llama-3.1-405b" and m["params"] == 405_853_388_800 for m in models)


def test_catalog_tables():
    out = cli("catalog", "instances").stdout
    assert "p4d.24xlarge" in out and "suspect" in out
    assert "a100-80gb" in cli("catalog", "gpus").stdout


def test_estimate_json_schema():
    out = cli("estimate", "--model", "llama-2-13b", "--instance", "p4d.24xlarge", "--strategy", "fsdp",
              "--tokens", "2e9", "--activation-checkpointing", "full", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["schema_version"] == 1
    assert r["model"]["name"] == "llama-2-13b" and r["model"]["params"] == 13_015_864_320
    assert set(r["memory"]["per_gpu_gib"]) == {"weights", "gradients", "optimizer", "activations", "other", "peak"}
    assert {"gpu_gib", "fits", "host_gib"} <= set(r["memory"])
    assert {"tokens_per_s", "tokens_per_s_per_gpu", "mfu", "step_time_s", "step_breakdown_s"} <= set(r["throughput"])
    assert r["time"]["train_hours"] > 0 and r["cost"]["total_usd"] > 0 and r["cost"]["spot_total_usd"] > 0
    assert r["setup"]["micro_batch"] >= 1 and any("largest that fits" in a for a in r["assumptions"])


def test_estimate_table():
    out = cli("estimate", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--gpus", "8", "--micro-batch", "2")
    assert out.returncode == 0
    for word in ("Memory per GPU", "Speed", "Time and cost", "checkpoints:"):
        assert word in out.stdout


def test_plan_save_then_estimate_job(tmp_path):
    job = tmp_path / "job.toml"
    out = cli("plan", "--model", "llama-2-13b", "--tokens", "2e9", "--top", "3", "--save", job)
    assert out.returncode == 0, out.stderr
    assert "Best setups" in out.stdout and "Launch" in out.stdout and job.exists()
    est = json.loads(cli("estimate", "--job", job, "--json").stdout)
    plan = json.loads(cli("plan", "--model", "llama-2-13b", "--tokens", "2e9", "--top", "1", "--json").stdout)
    best = plan["rows"][0]["estimate"]
    assert est["setup"]["instance"] == best["setup"]["instance"]
    assert est["cost"]["total_usd"] == pytest.approx(best["cost"]["total_usd"], rel=1e-6)
    # options given on the command line override the job file
    over = json.loads(cli("estimate", "--job", job, "--tokens", "4e9", "--json").stdout)
    assert over["time"]["train_hours"] == pytest.approx(2 * est["time"]["train_hours"], rel=1e-6)


def test_plan_json_and_nothing_fits():
    out = cli("plan", "--model", "llama-2-70b", "--tokens", "1e9", "--instances", "g5.xlarge", "--max-nodes", "1",
              "--json")
    assert out.returncode == 1
    r = json.loads(out.stdout)
    assert r["rows"] == [] and r["excluded"][0]["instance"] == "g5.xlarge"


@pytest.mark.parametrize("args,words", [
    (("estimate", "--model", "llama-2-14b", "--instance", "p4d.24xlarge"), "Did you mean: llama-2-13b"),
    (("estimate", "--model", "llama-2-13b", "--instance", "p4d.48xlarge"), "p4d.24xlarge"),
    (("estimate", "--model", "llama-2-13b", "--gpu", "a100-90gb"), "a100-80gb"),
    (("estimate", "--model", "llama-2-13b", "--instance", "p4d.24xlarge", "--tp", "3"), "divide the number of attention heads"),
    (("estimate", "--model", "llama-2-13b", "--instance", "p4d.24xlarge", "--micro-batch", "0"), "--micro-batch 0"),
    (("estimate", "--model", "llama-2-13b", "--instance", "p4d.24xlarge", "--strategy", "zero4"), "zero4"),
    (("plan", "--model", "llama-2-13b", "--clouds", "oracle"), "unknown cloud"),
    (("estimate", "--model-config", "/nonexistent/config.json", "--gpu", "h100-80gb"), "cannot read model config"),
    (("estimate", "--job", "/nonexistent/job.toml"), "cannot read job file"),
])
def test_usage_errors_exit_2_with_a_clear_message(args, words):
    out = cli(*args)
    assert out.returncode == 2
    assert words in out.stderr


def test_json_errors_are_json():
    out = cli("estimate", "--model", "nope", "--gpu", "h100-80gb", "--json")
    assert out.returncode == 2
    err = json.loads(out.stdout)["error"]
    assert err["exit_code"] == 2 and "unknown model 'nope'" in err["message"]


def test_bad_user_catalog_names_file_line_field(tmp_path):
    bad = tmp_path / "mine.toml"
    bad.write_text('[[instance]]\nname = "onprem"\ncloud = "dc"\ngpu = "a100-80gb"\ngpu_count = -1\ntopology = "nvswitch"\n')
    out = cli("catalog", "instances", "--catalog", bad)
    assert out.returncode == 2 and f"{bad}:5" in out.stderr and "gpu_count" in out.stderr


def test_planning_commands_need_no_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from trainready.cli.main import app\n"
            "app(['estimate', '--model', 'llama-2-7b', '--gpu', 'a100-80gb', '--json'], standalone_mode=False)\n"
            "app(['catalog', 'gpus', '--json'], standalone_mode=False)\n"
            "app(['plan', '--model', 'llama-2-7b', '--instances', 'p4d.24xlarge', '--json'], standalone_mode=False)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
