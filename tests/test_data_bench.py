"""`trainready data bench`: cold and warm passes, and the verdict against what training consumes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from run_helpers import env_for_run

from trainready.data.bench import DataBenchResult
from trainready.data.pack import pack


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for i in range(400):
        (src / f"doc{i:04d}.txt").write_text(("word " * (50 + i % 50)).strip())
    out = tmp_path_factory.mktemp("ds") / "ds"
    pack(src, str(out), "text", 16 << 10)
    return out


def bench(*args: str, env: dict | None = None) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "trainready", "data", "bench", *args], capture_output=True, text=True,
                          env=env_for_run(env), timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def test_keeps_up_and_starves(packed):
    code, out, _ = bench(str(packed), "--workers", "0", "--seconds", "5", "--plan-tokens-per-s", "1000", "--json")
    result = DataBenchResult.model_validate_json(out)
    assert code == 0 and result.keeps_up and result.ratio > 1
    assert result.cold.samples == result.warm.samples == 400 and result.cold.exhausted
    assert result.tokens_counted_as == "bytes" and "no tokenizer" in result.verdict
    code, out, _ = bench(str(packed), "--workers", "1", "--seconds", "5", "--plan-tokens-per-s", "1e12", "--json")
    result = json.loads(out)
    assert code == 1 and result["keeps_up"] is False and "will starve the GPUs by" in result["verdict"]


def test_compares_with_the_plan_and_reads_s3(packed, s3_bucket):
    url = f"s3://{s3_bucket}/ds"
    pack(_src_of(packed), url, "text", 16 << 10)
    code, out, err = bench(url, "--workers", "0", "--seconds", "5", "--model", "llama-2-7b", "--instance", "p4d.24xlarge")
    assert code in (0, 1), err
    assert "cold" in out and "warm" in out and "plan: llama-2-7b" in " ".join(out.split())
    assert not result_is_local(url)


def _src_of(packed):
    src = packed.parent / "again"
    src.mkdir(exist_ok=True)
    for i in range(50):
        (src / f"d{i}.txt").write_text("x" * (100 + i))
    return src


def result_is_local(url: str) -> bool:
    from trainready.data.index_io import is_local, open_dataset

    return is_local(open_dataset(url)[0])


@pytest.mark.parametrize("args, words", [
    (["/nonexistent/ds"], "/nonexistent/ds"),
    (["{ds}", "--model", "llama-2-7b"], "--model and --instance go together"),
    (["{ds}", "--plan-tokens-per-s", "5", "--model", "llama-2-7b", "--instance", "p4d.24xlarge"], "one of"),
    (["{ds}", "--model", "llama-2-7x", "--instance", "p4d.24xlarge"], "Did you mean"),
])
def test_usage_errors(packed, args, words):
    code, _, err = bench(*(a.format(ds=packed) for a in args))
    assert code == 2 and words in " ".join(err.split())
