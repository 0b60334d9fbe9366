"""`trainready data bench`: cold and warm passes, and the verdict against what training consumes."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys

import pytest
from cloud_stubs import invoke
from run_helpers import env_for_run

from trainready.data.bench import DataBenchResult, planned_need
from trainready.data.format import INDEX as INDEX_NAME
from trainready.data.pack import pack

SAMPLES = 400
TEXT_BYTES = sum(len(("word " * (50 + i % 50)).strip()) for i in range(SAMPLES))
NO_TORCH = ("import sys; sys.modules['torch'] = None  # as if torch were not installed\n"
            "sys.argv = ['trainready', 'data', 'bench', *sys.argv[1:]]\n"
            "from trainready.cli.main import run; run()")
NEEDS_TORCH = ("trainready data bench reads through a torch DataLoader: pip install 'trainready[torch,data]' "
               "(or your CUDA build of torch, then 'trainready[data]')")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for i in range(SAMPLES):
        (src / f"doc{i:04d}.txt").write_text(("word " * (50 + i % 50)).strip())
    out = tmp_path_factory.mktemp("ds") / "ds"
    pack(src, str(out), "text", 64 << 10)
    return out


def bench(*args: str, env: dict | None = None, code: str | None = None) -> tuple[int, str, str]:
    run = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "trainready", "data", "bench", *args]
    proc = subprocess.run(run, capture_output=True, text=True, env=env_for_run(env), timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def refused(*args: str) -> tuple[int, str, str]:
    """`data bench ARGS` that must stop before reading anything: the entry function in this process (issue 25)."""
    from cloud_stubs import cli_run

    proc = cli_run("data", "bench", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def test_keeps_up_reads_every_sample_cold_and_warm(packed):
    code, out, err = bench(str(packed), "--workers", "0", "--seconds", "120", "--plan-tokens-per-s", "1", "--json")
    assert (code, err) == (0, "")  # no progress bar in a pipe
    result = DataBenchResult.model_validate_json(out)
    assert (result.url, result.format, result.workers, result.local) == (str(packed), "text", 0, True)
    for p in (result.cold, result.warm):  # the time limit is far away: both passes read everything
        assert (p.samples, p.exhausted) == (SAMPLES, True)
        # rates from the exact time; `seconds` is shown rounded to 1 ms, so they agree to that
        assert TEXT_BYTES / p.tokens_per_s == pytest.approx(p.seconds, abs=0.0005 + 1e-9)
        assert SAMPLES / p.samples_per_s == pytest.approx(p.seconds, abs=0.0005 + 1e-9)
    assert result.need.model_dump() == {"tokens_per_s_per_node": 1.0, "source": "--plan-tokens-per-s"}
    assert result.keeps_up is True and result.ratio == pytest.approx(result.warm.tokens_per_s)
    assert result.tokens_counted_as == "bytes" and result.verdict.startswith("this pipeline delivers ")
    assert "bytes counted as tokens: no tokenizer" in result.verdict


def test_starves_with_worker_processes(packed):
    code, out, err = bench(str(packed), "--workers", "2", "--seconds", "120", "--plan-tokens-per-s", "1e12", "--json")
    assert (code, err) == (1, "")
    result = json.loads(out)
    assert result["workers"] == 2 and result["cold"]["samples"] == result["warm"]["samples"] == SAMPLES
    assert result["keeps_up"] is False and result["ratio"] < 1e-3
    assert result["verdict"].startswith("will starve the GPUs by 100%: ")


def test_table_at_80_columns(packed):
    code, out, err = bench(str(packed), "--workers", "0", "--seconds", "120", env={"COLUMNS": "80"})
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"{packed} (text, 0 workers, local: read in place)"
    assert all(len(line) <= 80 for line in lines[1:]) and "…" not in out and "None" not in out
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in lines if line.startswith("│")}
    assert rows == {"cold (all read)": f"{SAMPLES}", "warm (all read)": f"{SAMPLES}"}
    after = lines.index("tokens/s: bytes counted as tokens (text/JSONL, no tokenizer here)") + 1
    verdict = " ".join(line.strip() for line in lines[after:])  # wrapped at 80 columns between words
    assert re.fullmatch(r"delivers [\d,]+ tokens/s warm \(400 samples read; bytes counted as tokens: no tokenizer\); "
                        r"give --job or --plan-tokens-per-s to compare", verdict)


def test_progress_shows_on_a_terminal_only(packed):
    """The bar goes to stderr when it is a terminal (above: silent in a pipe)."""
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "trainready", "data", "bench", str(packed), "--workers", "0",
                               "--seconds", "120"], stdout=subprocess.PIPE, stderr=secondary, text=True,
                              env=env_for_run({"TERM": "xterm"}), timeout=300)
        os.close(secondary)
        secondary = -1
        terminal = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the other side is closed and everything was read
                break
            if not chunk:
                break
            terminal += chunk
    finally:
        os.close(primary)
        if secondary >= 0:
            os.close(secondary)
    assert proc.returncode == 0 and "cold (all read)" in proc.stdout
    assert "reading cold, then warm (seconds of 240)" in terminal.decode(errors="replace")


def test_compares_with_the_plan_and_reads_s3(packed, s3_bucket, tmp_path):
    from trainready.plan.job import JobSpec

    src = tmp_path / "src"
    src.mkdir()
    for i in range(50):  # ~1 MB: read in well under a second, against a need of ~28,000 tokens/s
        (src / f"d{i:02d}.txt").write_text("x" * (20_000 + i))
    url = f"s3://{s3_bucket}/ds"
    pack(src, url, "text", 256 << 10)
    code, out, err = bench(url, "--workers", "0", "--seconds", "120", "--model", "llama-2-7b", "--instance",
                           "p4d.24xlarge", "--json")
    assert (code, err) == (0, "")
    result = DataBenchResult.model_validate_json(out)
    need = planned_need(None, JobSpec(model="llama-2-7b", instance="p4d.24xlarge"))
    assert result.need == need and need.source.startswith("plan: llama-2-7b on 8 x a100-40gb per node (1 node(s)")
    assert result.local is False and result.cold.samples == result.warm.samples == 50
    assert result.keeps_up is True and result.ratio == pytest.approx(result.warm.tokens_per_s / need.tokens_per_s_per_node)


def test_a_corrupt_shard_read_by_a_worker_is_one_line_exit_1(packed, tmp_path):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    shard = ds / "shards" / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[700] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, out, err = bench(str(ds), "--workers", "2", "--seconds", "120")
    assert (code, out) == (1, "")
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: DataLoader worker 0: shard shards/shard-000001.tar ({shard}) is corrupt: sha256 ")


def test_without_torch_is_a_usage_error_saying_what_to_install(packed):
    code, out, err = bench(str(packed), code=NO_TORCH)
    assert (code, out, err) == (2, "", f"error: {NEEDS_TORCH}\n")
    code, out, _ = bench(str(packed), "--json", code=NO_TORCH)
    assert code == 2 and json.loads(out) == {"schema_version": 1, "error": {"message": NEEDS_TORCH, "exit_code": 2}}


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/ds"], "no packed dataset at /nonexistent/ds: nothing exists at /nonexistent/ds. Pack one with "
                          "`trainready data pack SRC --out URL`."),
    (["{ds}", "--model", "llama-2-7b"], "--model and --instance go together (or use --job / --plan-tokens-per-s)"),
    (["{ds}", "--plan-tokens-per-s", "5", "--model", "llama-2-7b", "--instance", "p4d.24xlarge"],
     "compare with one of --plan-tokens-per-s, --job, or --model with --instance"),
    (["{ds}", "--plan-tokens-per-s", "0"], "--plan-tokens-per-s 0: must be > 0"),
    (["{ds}", "--model", "llama-2-7x", "--instance", "p4d.24xlarge"],
     "unknown model 'llama-2-7x'. Did you mean: llama-2-7b, llama-2-70b, llama-3-70b?"),
])
def test_usage_errors(packed, args, message):
    code, out, err = refused(*(a.format(ds=packed) for a in args))
    assert (code, out) == (2, "") and err.startswith(f"error: {message}") and len(err.splitlines()) == 1


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def test_too_many_workers_is_refused_before_any_starts(packed):
    """--workers 100000 once forked thousands of processes and never finished."""
    cpus = _cpus()
    cap = min(4 * cpus, 256)
    # a process of its own: should the check ever go, the forks must not come from the test process
    code, out, err = bench(str(packed), "--workers", "100000", "--seconds", "1")
    assert (code, out) == (2, "")
    assert err == (f"error: --workers 100000 is too many for this machine: at most {cap} (4 per CPU, {cpus} CPUs "
                   "usable here, never more than 256)\n")
    code, out, err = refused(str(packed), "--workers", str(cap + 1), "--seconds", "1", "--json")
    assert code == 2 and json.loads(out)["error"]["message"].startswith(f"--workers {cap + 1} is too many")
    assert refused(str(packed), "--workers", "-1")[::2] == (2, "error: --workers -1: must be 0 (read in the main "
                                                             "process) or more\n")


def test_default_workers_fit_the_cpus_and_torch_never_warns(packed):
    """The default is 4 workers, or one per CPU when there are fewer; more workers than CPUs (as
    asked) get one note of ours, not torch's 443-character UserWarning twice."""
    code, out, err = bench(str(packed), "--seconds", "120", "--json")
    assert (code, err) == (0, "") and json.loads(out)["workers"] == min(4, _cpus())
    more = _cpus() + 1
    code, out, err = bench(str(packed), "--workers", str(more), "--seconds", "120")
    assert code == 0 and out.startswith(f"{packed} (text, {more} workers, local: read in place)\n")
    assert err == (f"note: {more} workers on {_cpus()} usable CPU{'s' if _cpus() != 1 else ''}: they share the cores, "
                   f"which helps only while they wait on storage (torch suggests at most {_cpus()})\n")


@pytest.mark.parametrize("args, message", [
    (["--seconds", "nan"], "--seconds nan: not a finite number; give seconds from 0.1 to 86400 (a day), e.g. 20"),
    (["--seconds", "inf"], "--seconds inf: not a finite number; give seconds from 0.1 to 86400 (a day), e.g. 20"),
    (["--seconds", "0.05"], "--seconds 0.05: give seconds from 0.1 to 86400 (a day), e.g. 20"),
    (["--seconds", "1e300"], "--seconds 1e+300: give seconds from 0.1 to 86400 (a day), e.g. 20"),
    (["--plan-tokens-per-s", "inf"], "--plan-tokens-per-s inf: not a finite number; give the tokens/s one node "
                                     "consumes, e.g. 50000"),
    (["--plan-tokens-per-s", "nan"], "--plan-tokens-per-s nan: not a finite number; give the tokens/s one node "
                                     "consumes, e.g. 50000"),
])
def test_numbers_that_are_not_finite_or_out_of_range(packed, args, message):
    code, out, err = refused(str(packed), "--workers", "0", *args)
    assert (code, out, err) == (2, "", f"error: {message}\n")


def test_locations_that_cannot_be_a_dataset(tmp_path, monkeypatch):
    (tmp_path / "loopa").symlink_to("loopb")
    (tmp_path / "loopb").symlink_to("loopa")
    (tmp_path / INDEX_NAME).write_text("{}")  # an empty URL once meant this directory
    long = "x" * 300
    cases = [("", "the dataset location '' is empty: give a directory, file:///path or s3://bucket/prefix (use . "
                  "for the current directory)"),
             ("s3://", "s3://: no bucket in the URL (s3://BUCKET/prefix)"),
             ("s3:///ds", "s3:///ds: no bucket in the URL (s3://BUCKET/prefix)"),
             ("s3://Bad_Bucket!/x", "s3://Bad_Bucket!/x: invalid bucket name 'Bad_Bucket!'"),
             ("loopa", "loopa: a symlink loop (symbolic links that point at each other) on the way to it; remove or "
                       "fix the links, or choose another path"),
             (long, f"{long}: the name '{'x' * 20}...{'x' * 12}' is 300 bytes, longer than the file system allows "
                    "(255); choose a shorter name")]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "250")  # Rich wraps messages at the terminal width; keep them on one line
    for url, message in cases:  # in this process: the command refuses each before reading anything
        code, out, err = invoke("data", "bench", url, "--workers", "0", "--seconds", "1")
        assert (code, out) == (2, ""), url
        assert err.startswith(f"error: {message}") and len(err.splitlines()) == 1, err
