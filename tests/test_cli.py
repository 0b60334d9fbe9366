"""The `trainready` command end to end: output, JSON, exit codes, errors without tracebacks."""

import json
import re
import subprocess
import sys

import pytest
from cloud_stubs import cli_run


def cli(*args, cwd=None):
    """In this process (cloud_stubs.cli_run); test_help_and_version and the 80-column tests below keep real
    subprocesses, through a pipe."""
    proc = cli_run(*args, cwd=cwd)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    return proc


def cli_process(*args):
    proc = subprocess.run([sys.executable, "-m", "trainready", *map(str, args)], capture_output=True, text=True,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    return proc


def test_help_and_version():
    assert cli_process("--help").returncode == 0
    assert cli_process("--version").stdout.startswith("trainready ")
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
    # 2 nodes: on one, DeepSpeed's ZeRO-3 (the default stack's framework) leaves less than the margin at micro-batch 1
    out = cli("estimate", "--model", "llama-2-13b", "--instance", "p4d.24xlarge", "--gpus", "16", "--strategy", "fsdp",
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
    (("estimate", "--model", "llama-2-13b", "--instance", "p4d.24xlarge", "--micro-batch", "0"),
     "'--micro-batch': 0 is not a whole number from 1 to 16,777,216, e.g. 4"),
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


# ------------------------------------------------------------------ user mistakes: exit 2, one line

BINARY = b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00>\x00\x01\x00\x00\x00\xd0\xff"


@pytest.mark.parametrize("args,words", [
    (("plan", "--model", "llama-2-13b", "--tokens", "inf"),
     "Invalid value for '--tokens': inf is not a finite number; give a number above 0, e.g. 2e9"),
    (("plan", "--model", "llama-2-13b", "--tokens", "1e309"),  # named as typed, not as "inf"
     "Invalid value for '--tokens': 1e309 is not a finite number; give a number above 0, e.g. 2e9"),
    (("plan", "--model", "llama-2-7b", "--memory-margin", "nan"),
     "'--memory-margin': nan is not a finite number; give a number from 0 to 0.5, e.g. 0.1"),
    (("plan", "--model", "llama-2-7b", "--memory-margin", "0.7"), "'--memory-margin': 0.7 is not a number from 0 to 0.5"),
    (("plan", "--model", "llama-2-7b", "--top", "0"), "'--top': 0 is not a whole number from 1 to 100, e.g. 5"),
    (("plan", "--model", "llama-2-7b", "--max-nodes", "2.5"),
     "'--max-nodes': 2.5 is not a whole number; give a whole number from 1"),
    (("estimate", "--model", "llama-2-7b", "--gpu", "h100", "--gpus", "true"),
     "'--gpus': 'true' is not a number; give a whole number"),
    (("estimate", "--model", "llama-2-7b", "--instance", "p4d.24xlarge", "--usd-per-hour", "1e5"),
     "'--usd-per-hour': 1e5 is not a number above 0, at most 10,000, e.g. 32.77"),
    (("plan", "--model", "llama-2-13b", "--tokens", "nan"), "Invalid value for '--tokens': nan is not a finite number"),
    (("estimate", "--model", "llama-2-13b", "--gpu", "h100", "--tokens", "inf"), "'--tokens': inf is not a finite number"),
    (("estimate", "--model", "llama-2-13b", "--gpu", "h100", "--tokens", "-2e9"),
     "'--tokens': -2e9 is not a number above 0, e.g. 2e9"),
    (("plan", "--params", "nan"), "Invalid value for '--params': nan is not a finite number; give a number above 0, e.g. 13e9"),
    (("plan", "--model", "llama-2-7b", "--usd-per-hour", "-1"), "'--usd-per-hour': -1 is not a number above 0, at most 10,000"),
    (("plan", "--model", "llama-2-7b", "--max-usd", "nan"), "'--max-usd': nan is not a finite number; give a number above 0"),
    (("plan", "--model", "llama-2-7b", "--max-usd", "-5"), "'--max-usd': -5 is not a number above 0"),
    (("plan", "--model", "llama-2-7b", "--deadline-hours", "inf"), "'--deadline-hours': inf is not a finite number"),
    (("plan", "--model", "llama-2-7b", "--min-gpu-mem", "nan"), "'--min-gpu-mem': nan is not a finite number"),
    (("estimate", "--model", "llama-2-7b", "--gpu", "h100", "--spot-mtbf-hours", "0"), "'--spot-mtbf-hours': 0 is not"),
    (("estimate", "--model", "llama-2-7b", "--gpu", "h100", "--inter-node-gbps", "inf"), "'--inter-node-gbps': inf"),
    (("estimate", "--model", "llama-2-7b", "--gpu", "h100", "--seq-len", "10" * 12),
     "'--seq-len': 101010101010101010101010 is not a whole number from 1 to 16,777,216"),
    (("plan", "--model", "llama-2-7b", "--job", "{binary}"), "job file {binary} is not a text file (byte 24 is not UTF-8)"),
    (("plan", "--model", "llama-2-7b", "--catalog", "{binary}"), "catalog file {binary} is not a text file (byte 24"),
    (("estimate", "--model-config", "{binary}", "--gpu", "h100"), "model config {binary} is not a text file (byte 24"),
    (("plan", "--model", "llama-2-7b", "--job", "{dir}"), "cannot read job file {dir}: it is a directory, not a file"),
    (("catalog", "gpus", "--catalog", "{dir}"), "cannot read catalog file {dir}: it is a directory, not a file"),
    (("estimate", "--job", "/dev/zero"), "job file /dev/zero is more than the 16 MiB a job file may have"),
    (("estimate", "--job", "{empty}"), "job file {empty} is empty: a job spec starts with schema_version = 1"),
    (("plan", "--model", "llama-2-7b", "--global-batch", "3", "--instances", "p4d.24xlarge", "--json"), None),
])
def test_user_mistakes_are_one_line_errors_with_exit_2(tmp_path, args, words):
    binary, empty = tmp_path / "ls", tmp_path / "empty.toml"
    binary.write_bytes(BINARY)
    empty.write_text("")
    fill = {"binary": str(binary), "dir": str(tmp_path), "empty": str(empty)}
    out = cli(*(a.format(**fill) for a in args))
    if words is None:  # a plan nothing fits: the answer is negative (1), not a usage error
        assert out.returncode == 1
        assert json.loads(out.stdout)["excluded"][0]["reason"].endswith("(nearest valid: 8)")
        return
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert words.format(**fill) in out.stderr


def test_a_binary_job_file_with_json_is_a_json_error(tmp_path):
    binary = tmp_path / "job.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    out = cli("estimate", "--job", binary, "--json")
    assert out.returncode == 2
    assert json.loads(out.stdout)["error"] == {
        "message": f"job file {binary} is not a text file (byte 0 is not UTF-8): is it the right file?", "exit_code": 2}


def test_a_model_name_prints_as_typed():
    out = cli("estimate", "--model", "llama[/x]", "--gpu", "h100")
    assert out.returncode == 2
    assert out.stderr.startswith("error: unknown model 'llama[/x]'. Did you mean: ")


# ------------------------------------------------------------------ 80 columns, through a pipe

def cli80(*args, code=0):
    proc = subprocess.run([sys.executable, "-m", "trainready", *map(str, args)], capture_output=True, text=True,
                          env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"})  # stdout is a pipe here
    assert proc.returncode == code, proc.stderr
    for text in (proc.stdout, proc.stderr):
        assert "…" not in text and "None" not in text, text  # nothing cut, no Python None
        assert max(map(len, text.splitlines()), default=0) <= 80
    return proc.stdout


def _line_with(out: str, name: str) -> str:
    lines = [ln for ln in out.splitlines() if f" {name} " in f" {ln} "]
    assert lines, f"{name} is not printed whole"
    return lines[0]


def test_catalog_instances_at_80_columns_prints_every_name_and_price_whole():
    out = cli80("catalog", "instances")
    for inst in json.loads(cli("catalog", "instances", "--json").stdout)["instances"]:
        row = _line_with(out, inst["name"])
        for p in inst["price"]:
            if p["usd_per_hour"] is not None:
                assert f"{p['usd_per_hour']:,.2f}" in row, (inst["name"], row)
    assert "not shown in 80 columns: region" in out  # what did not fit is named


def test_catalog_gpus_and_models_at_80_columns_print_every_name_and_figure_whole():
    out = cli80("catalog", "gpus")
    for g in json.loads(cli("catalog", "gpus", "--json").stdout)["gpus"]:
        row = _line_with(out, g["name"])
        assert f" {g['memory_gib']:g} " in row and f" {g['hbm_gbps']:g} " in row
        if g["tflops"]["bf16"]:
            assert f" {g['tflops']['bf16']:g} " in row
    out = cli80("catalog", "models")
    for m in json.loads(cli("catalog", "models", "--json").stdout)["models"]:
        assert f"{m['params'] / 1e9:,.2f}B" in _line_with(out, m["name"])


@pytest.mark.parametrize("args", [
    ("--model", "llama-2-70b", "--tokens", "2e11", "--clouds", "azure"),  # the longest instance names
    ("--model", "llama-2-70b", "--tokens", "2e11", "--by", "time", "--top", "8"),  # 16 nodes, days, $100,000s
    ("--params", "1e9", "--tokens", "1e30"),  # absurd: huge figures, still whole and short
    ("--model", "llama-2-7b", "--spot"),
])
def test_plan_at_80_columns_prints_every_row_whole(args):
    from trainready.plan.units import hours_text, usd_text

    out = cli80("plan", *args)
    result = json.loads(cli("plan", *args, "--json").stdout)
    for row in result["rows"]:
        e = row["estimate"]
        line = _line_with(out, f"{e['setup']['nodes']} x {e['setup']['instance']}")
        cost = e["cost"]["total_usd"] if result["tokens"] else e["cost"]["usd_per_billion_tokens"]
        assert f" {usd_text(cost)}" in line and (not result["tokens"] or f" {hours_text(e['time']['train_hours'])} " in line)
    assert not re.search(r"\d{16}", out.replace(",", ""))  # no 31-digit integers


def test_huge_token_counts_are_written_short():
    out = cli80("plan", "--params", "1e9", "--tokens", "1e30", "--top", "1")
    assert out.startswith("generic-1b (0.93B), full, 1.0e30 tokens, ranked by cost")
    out = cli80("estimate", "--model", "llama-2-7b", "--instance", "p4d.24xlarge", "--tokens", "1e30")
    est = json.loads(cli("estimate", "--model", "llama-2-7b", "--instance", "p4d.24xlarge", "--tokens", "1e30",
                         "--json").stdout)
    assert f"{est['time']['steps']:.1e}".replace("e+", "e") in out  # 9.5e23 steps, not 24 digits
    assert not re.search(r"\d{16}", out.replace(",", ""))


def test_plan_max_usd_excluded_rows_at_80_columns_name_the_cheapest_cost():
    out = cli80("plan", "--model", "llama-2-13b", "--tokens", "2e10", "--max-usd", "10", code=1)
    assert "gpu_8x_h100_sxm5: fits, but its cheapest setup (1 node) costs $5,4" in " ".join(out.split())


def test_no_python_none_in_human_output(tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text('[[instance]]\nname = "onprem"\ncloud = "dc"\ngpu = "h100"\ngpu_count = 8\ntopology = "nvswitch"\n'
                    '[[instance.price]]\nregion = "dc1"\nmodel = "on-demand"\nsuspect = true\n'
                    '[[instance]]\nname = "p4d.24xlarge"\n[[instance.price]]\nregion = "us-east-1"\n'
                    'model = "spot"\nusd_per_hour = 1.5\nsuspect = true\n')
    for code, args in ((0, ("catalog", "instances", "--catalog", mine)),
                       (0, ("estimate", "--model", "llama-2-7b", "--instance", "onprem", "--catalog", mine)),
                       (0, ("estimate", "--model", "llama-2-7b", "--instance", "p4d.24xlarge", "--spot", "--catalog", mine)),
                       (0, ("estimate", "--model", "llama-2-7b", "--gpu", "a10g", "--gpus", "16", "--inter-node-gbps", "100")),
                       (1, ("plan", "--model", "llama-2-7b", "--instances", "onprem,p5e.48xlarge", "--catalog", mine))):
        out = cli(*args)
        assert out.returncode == code and "None" not in out.stdout + out.stderr, args
    assert "marked suspect: verify it before buying" in cli(
        "estimate", "--model", "llama-2-7b", "--instance", "p4d.24xlarge", "--spot", "--catalog", mine).stdout


def test_readme_install_line_names_every_extra_and_the_project_has_urls():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"]) - {"dev"}
    named = re.findall(r"pip install 'trainready\[([a-z0-9,]+)\]'", (root / "README.md").read_text())
    assert extras in [set(n.split(",")) for n in named], named  # one line a user copies to get everything
    assert {"Homepage", "Documentation", "Issues"} <= set(project["urls"])


# ------------------------------------------------------------------ reviewer's findings (issue 12)

@pytest.mark.parametrize("args,message", [
    (("plan", "--model", "llama-2-7b", "--tokens", "1e9", "--region", "us-est-1"),
     "error: unknown region 'us-est-1'. Did you mean: us-west-1, us-east-1, us-west1? The catalog has prices in: "
     "eastus, us-central1, us-east-1, us-east-2 (`trainready catalog instances --json` lists every instance's regions).\n"),
    (("estimate", "--model", "llama-2-7b", "--instance", "p4d.24xlarge", "--region", "us-est-1", "--tokens", "1e9"),
     "error: unknown region 'us-est-1'. Did you mean: us-east-1? p4d.24xlarge has a price in: us-east-1.\n"),
    (("estimate", "--model", "llama-2-7b", "--instance", "p4d.24xlarge", "--region", "eu-west-1"),
     "error: p4d.24xlarge has no price in eu-west-1 in the catalog; it has one in: us-east-1. Give one of those as "
     "--region, or your price as --usd-per-hour.\n"),
])
def test_a_mistyped_region_is_a_usage_error(args, message):
    out = cli(*args)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", message)


def test_a_region_spelled_loosely_prices_in_the_catalog_region():
    est = json.loads(cli("estimate", "--model", "llama-2-7b", "--instance", "p4d.24xlarge", "--region", "US-EAST-1",
                         "--tokens", "1e9", "--json").stdout)
    assert est["cost"]["pricing"]["region"] == "us-east-1" and est["cost"]["total_usd"] > 0


def _commands():
    import typer

    from trainready.cli.main import app

    root = typer.main.get_command(app)
    yield ("plan",), root.commands["plan"]
    yield ("estimate",), root.commands["estimate"]
    yield ("catalog",), root.commands["catalog"]
    for name, sub in root.commands["catalog"].commands.items():
        yield ("catalog", name), sub


@pytest.mark.parametrize("path,command", list(_commands()), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_help_fits_80_columns_with_every_option_name_and_choice_whole(path, command):
    out = cli80(*path, "-h")
    for param in command.params:
        for opt in (*param.opts, *param.secondary_opts):
            if opt.startswith("--"):
                assert re.search(rf"(^|[\s,]){re.escape(opt)}([\s,]|$)", out, re.M), (opt, out)
        choices = getattr(getattr(param, "type_descriptor", None), "choices", None)
        if choices and param.show_choices:  # shown as a|b|c: on one line, never folded
            assert "|".join(str(getattr(c, "value", c)) for c in choices) in out, param.name
        elif choices:  # shown as a word (MODE): the help text lists every choice
            help_text = " ".join(param.help.split())
            assert all(str(c.value) in help_text for c in choices), param.name


def test_estimate_help_lists_long_choices_in_words():
    out = " ".join(cli80("estimate", "-h").replace("\u2502", " ").split())  # without the panel's borders
    assert "--activation-checkpointing MODE Recompute activations in backward: none, selective or full." in out
    assert "--offload STATES Move to host RAM: none, optimizer" in out


def test_big_catalog_figures_print_short_and_absurd_prices_are_refused(tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text('[[instance]]\nname = "huge"\ncloud = "dc"\ngpu = "h100"\ngpu_count = 8\ntopology = "nvswitch"\n'
                    'vcpus = 100000000000000000000\nram_gib = 1e20\nnetwork_gbps = 1e300\n'
                    '[[instance.price]]\nregion = "dc1"\nmodel = "on-demand"\nusd_per_hour = 9999.99\n')
    out = cli80("catalog", "instances", "--catalog", mine)
    assert "1.0e20" in _line_with(out, "huge") and "9,999.99" in _line_with(out, "huge")
    assert not re.search(r"\d{16}", out.replace(",", ""))
    mine.write_text(mine.read_text().replace("9999.99", "1e300"))
    out = cli("catalog", "instances", "--catalog", mine)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (f"error: {mine}:13: field 'instance.price.usd_per_hour': Input should be less than or "
                          f"equal to 10000\n")


def test_control_characters_in_names_are_escaped_where_messages_are_built(tmp_path):
    out = cli("estimate", "--model", "llama\x1b[2J\x1b]0;x\x07", "--gpu", "h100")
    assert out.returncode == 2
    assert out.stderr.startswith("error: unknown model 'llama\\x1b[2J\\x1b]0;x\\x07'. Did you mean: ")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"_name_or_path": "evil\x1b[31m\u202emodel", "model_type": "llama",
                                  "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                                  "num_hidden_layers": 32, "num_attention_heads": 32}))
    out = cli("estimate", "--model-config", config, "--gpu", "h100", "--tokens", "1e9")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("evil\\x1b[31m\\u202emodel (6.74B parameters)")
    assert "\x1b" not in out.stdout and "\u202e" not in out.stdout


def test_launch_commands_paste_as_the_commands_of_the_recipe():
    args = ("plan", "--model", "llama-2-70b", "--tokens", "1e9", "--clouds", "aws", "--top", "1")
    recipe = json.loads(cli(*args, "--json").stdout)["recipe"]
    assert len(recipe["torchrun"]) >= 2  # multi-node: the long commands
    out = cli80(*args)
    launch = out.split("Launch (best row)", 1)[1].split(f"\n{recipe['config_kind']}:\n", 1)
    lines = launch[0].splitlines()[1:]
    assert all(len(ln) <= 80 for ln in lines)
    commands, cur = [], ""
    for ln in lines:  # what a shell reads: a trailing backslash continues the line
        cur += ln[:-1] if ln.endswith("\\") else ln
        if not ln.endswith("\\"):
            commands.append(" ".join(cur.split()))
            cur = ""
    env = " ".join(f"{k}={v}" for k, v in recipe["env"].items())
    assert commands == [f"{env} {cmd}" for cmd in recipe["torchrun"]]
    assert launch[1].startswith(recipe["config"])  # the config as it is, not in a bordered panel
