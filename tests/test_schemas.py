"""The documented JSON schemas (docs/schemas) hold for what trainready really prints and writes.

docs/schemas has one schema for every `--json` output and every file trainready writes, generated
from the pydantic models (`python -m trainready.schemas docs/schemas`). These tests hold the
committed files to the two promises the README makes:
- they are what the models generate now and they are committed (a model change without a docs
  update fails, and so does a schema file that documents nothing);
- each command, run as a user runs it on realistic input, prints (or writes) documents that
  validate against the committed schema, with every field it prints documented: the schemas are
  validated in a strict copy where an object takes no property its schema does not list.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from run_helpers import TINY_GPT, env_for_run, records, wait_for
from shared_runs import shared_result

from trainready.plan import track_record
from trainready.schemas import ROOT_MODELS, SCHEMAS, render

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "schemas"
LOGS = ROOT / "tests" / "fixtures" / "run" / "logs"
BUNDLES = ROOT / "tests" / "fixtures" / "check" / "bundles"

Outputs = dict[str, list[tuple[str, Any]]]  # schema name -> (what produced it, the document)
# Formats past their first version, and why: check 2 (issue 23) added `readiness`, made a check that does not
# apply `skip` (was `pass`), and exits 1 when the deciding checks had no evidence; track-record 2 (issue 24) gave each
# regime its training stack, so a version-1 record (its regimes naming none) is refused, not half-matched; 3 gave each
# run the memory model's error against its published peak and each regime its MoE dispatcher (the memory record).
VERSIONS = {"check": 2, "track-record": 3}


# ------------------------------------------------------------ the committed files are the code's

@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_committed_schema_matches_code(name):
    path = DOCS / f"{name}.schema.json"
    assert path.is_file(), f"docs/schemas/{name}.schema.json is missing: run `python -m trainready.schemas docs/schemas`"
    assert path.read_text() == render(name), (
        f"docs/schemas/{name}.schema.json is stale: run `python -m trainready.schemas docs/schemas` "
        "and describe the change in docs/")


def test_every_schema_file_documents_an_output():
    assert sorted(p.name for p in DOCS.iterdir()) == sorted(f"{name}.schema.json" for name in SCHEMAS)


def test_schema_files_are_tracked_by_git():
    proc = subprocess.run(["git", "ls-files", "--", "docs/schemas"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
    assert sorted(Path(p).name for p in proc.stdout.split()) == sorted(f"{name}.schema.json" for name in SCHEMAS)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_schema_is_a_valid_versioned_json_schema(name):
    schema = json.loads((DOCS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    if name in ROOT_MODELS:  # telemetry: one schema per record type, each versioned
        members = [schema["$defs"][ref["$ref"].rsplit("/", 1)[-1]] for ref in schema["oneOf"]]
    else:
        members = [schema]
    for member in members:
        version = member["properties"]["schema_version"]
        assert version.get("const", version.get("default")) == VERSIONS.get(name, 1), member.get("title")


# ------------------------------------------------------------ real outputs, run as a user runs them

def strict(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists its properties and says
    nothing about others: a field the output has and the documentation lacks fails validation."""
    if isinstance(schema, dict):
        out = {key: strict(value) for key, value in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(value) for value in schema]
    return schema


def _no_constant(token: str) -> None:
    raise AssertionError(f"not JSON: {token} (JSON has no NaN or Infinity)")


def parse(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constant)


OWN_PROCESS = {"run", "data"}
"""Commands that start processes of their own (torchrun, DataLoader workers) run as a user runs them; the others
run the console script's entry function in this process (cloud_stubs.cli_run: the same code, seconds faster)."""


def trainready(*args: str, cwd: Path, expect: int = 0, timeout: float = 180) -> str:
    if args[0] in OWN_PROCESS:
        proc = subprocess.run([sys.executable, "-m", "trainready", *args], cwd=cwd, env=env_for_run(),
                              capture_output=True, text=True, timeout=timeout)
    else:
        from cloud_stubs import cli_run

        proc = cli_run(*args, cwd=cwd)
    assert proc.returncode == expect, f"trainready {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout


def json_of(outputs: Outputs, name: str, *args: str, cwd: Path, expect: int = 0, timeout: float = 180) -> None:
    outputs.setdefault(name, []).append((" ".join(args), parse(trainready(*args, cwd=cwd, expect=expect,
                                                                          timeout=timeout))))


def file_of(outputs: Outputs, name: str, path: Path) -> None:
    text = path.read_text()
    docs = [parse(line) for line in text.splitlines()] if path.suffix == ".jsonl" else \
        [tomllib.loads(text)] if path.suffix == ".toml" else [parse(text)]
    assert docs, path
    outputs.setdefault(name, []).extend((str(path), doc) for doc in docs)


# Each producer runs once per test session, whichever xdist workers its tests land on (shared_runs): the
# training one is a real run. Their outputs are JSON already, so what the tests read is what was produced.

@pytest.fixture(scope="module")
def planning(tmp_path_factory) -> Outputs:
    return shared_result(tmp_path_factory, "schemas-planning", _planning)


@pytest.fixture(scope="module")
def training(tmp_path_factory) -> Outputs:
    return shared_result(tmp_path_factory, "schemas-training", _training)


@pytest.fixture(scope="module")
def node_and_data(tmp_path_factory) -> Outputs:
    return shared_result(tmp_path_factory, "schemas-node-and-data", _node_and_data)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory, moto) -> Outputs:
    return shared_result(tmp_path_factory, "schemas-cloud", lambda cwd: _cloud(cwd, moto.url))


def _planning(cwd: Path) -> Outputs:
    """catalog, estimate, plan, diagnose, job files and errors: each a few realistic invocations."""
    out: Outputs = {}
    for what in ("gpus", "instances", "models"):
        json_of(out, f"catalog-{what}", "catalog", what, "--json", cwd=cwd)
    json_of(out, "estimate", "estimate", "--model", "llama-2-13b", "--instance", "p4d.24xlarge", "--strategy", "fsdp",
            "--tokens", "2e9", "--save", "estimated.toml", "--json", cwd=cwd)
    json_of(out, "estimate", "estimate", "--model", "llama-2-70b", "--instance", "p4de.24xlarge", "--gpus", "32",
            "--strategy", "fsdp", "--activation-checkpointing", "full", "--tokens", "2e10", "--spot", "--json", cwd=cwd)
    json_of(out, "estimate", "estimate", "--params", "7e9", "--gpu", "h100-80gb", "--gpus", "8", "--method", "qlora",
            "--json", cwd=cwd)  # no tokens, no price: the nulls
    json_of(out, "plan", "plan", "--model", "llama-2-13b", "--tokens", "2e9", "--save", "planned.toml", "--json", cwd=cwd)
    json_of(out, "plan", "plan", "--model", "llama-2-70b", "--tokens", "2e10", "--max-usd", "1", "--json", cwd=cwd,
            expect=1)  # nothing fits
    file_of(out, "job", cwd / "planned.toml")
    file_of(out, "job", cwd / "estimated.toml")
    bundle = cwd / "deep-bundle"  # a check --deep bundle: GEMM and all-reduce figures to calibrate from
    bundle.mkdir()
    (bundle / "instance-type.txt").write_text("p5en.48xlarge\n")
    (bundle / "deep.json").write_text(json.dumps({"schema_version": 1, "gemm": {"size": 8192, "tflops": 650.0}, "allreduce": {
        "backend": "nccl", "world_size": 8, "busbw_gbps": 300.0, "rows": [{"size_bytes": 1 << 28, "busbw_gbps": 300.0}]}}))
    json_of(out, "estimate", "estimate", "--model", "llama-3-8b", "--instance", "p5en.48xlarge", "--calibrate",
            str(bundle), "--calibration", "calibration.json", "--json", cwd=cwd)
    file_of(out, "calibration", cwd / "calibration.json")
    # written by bench/track_record.py, shipped in the package (tests/test_track_record.py checks it is current)
    file_of(out, "track-record", Path(track_record.__file__).parent / "data" / "track_record.json")
    json_of(out, "diagnose", "diagnose", str(LOGS / "cuda_oom.log"), "--job", "planned.toml", "--json", cwd=cwd, expect=1)
    json_of(out, "diagnose", "diagnose", str(LOGS), "--json", cwd=cwd, expect=1)  # every rule
    json_of(out, "diagnose", "diagnose", str(LOGS / "healthy_training.log"), "--json", cwd=cwd)
    json_of(out, "error", "estimate", "--model", "no-such-model", "--json", cwd=cwd, expect=2)
    json_of(out, "error", "plan", "--no-such-option", "--json", cwd=cwd, expect=2)
    json_of(out, "error", "diagnose", "missing.log", "--json", cwd=cwd, expect=2)
    json_of(out, "error", "ckpt", "verify", str(cwd / "nowhere"), "--json", cwd=cwd, expect=2)
    return out


def _training(cwd: Path) -> Outputs:
    """One real run stopped by SIGTERM after its first step (every run file, stop.json included, and a
    checkpoint), then report and every ckpt command on it, and a one-point scaling run."""
    out: Outputs = {}
    run_dir = cwd / "run"
    with (cwd / "stderr.txt").open("w") as stderr:  # workers' output goes to stderr under --json
        proc = subprocess.Popen([sys.executable, "-m", "trainready", "run", "--json", "--run-dir", str(run_dir),
                                 "--nproc-per-node", "1", "--usd-per-hour", "3.5", "--", sys.executable, str(TINY_GPT),
                                 "--steps", "100000"], cwd=cwd, env=env_for_run(), stdout=subprocess.PIPE, stderr=stderr,
                                text=True)
        try:
            wait_for(lambda: any(r["type"] == "step" for r in records(run_dir)), 150, "the first step")
        finally:
            proc.send_signal(signal.SIGTERM)  # stopped like a spot reclaim: save, stop.json, exit 143
            stdout, _ = proc.communicate(timeout=150)
    assert proc.returncode == 143, (cwd / "stderr.txt").read_text()[-3000:]
    out["run-result"] = [("run --json, then SIGTERM", parse(stdout))]
    assert out["run-result"][0][1]["reason"] == "signal"
    json_of(out, "run-summary", "report", str(run_dir), "--json", cwd=cwd)
    file_of(out, "run-summary", run_dir / "summary.json")
    file_of(out, "run-info", run_dir / "run.json")
    file_of(out, "run-stop", run_dir / "stop.json")
    file_of(out, "run-telemetry", run_dir / "telemetry.jsonl")
    ckpts = run_dir / "checkpoints"
    *_, step_dir = sorted(ckpts.glob("step-*"))  # --ckpt-every auto may have saved before the SIGTERM save
    file_of(out, "ckpt-manifest", step_dir / "manifest.json")
    file_of(out, "ckpt-tensor-index", step_dir / "tensors.json")
    file_of(out, "ckpt-lease", ckpts / "writer.json")
    step = str(int(step_dir.name.split("-")[1]))
    json_of(out, "ckpt-ls", "ckpt", "ls", str(ckpts), "--verify", "--json", cwd=cwd)
    json_of(out, "ckpt-verify", "ckpt", "verify", str(ckpts), "--json", cwd=cwd)
    json_of(out, "ckpt-pull", "ckpt", "pull", str(ckpts), "--step", step, "--to", "pulled", "--json", cwd=cwd)
    json_of(out, "ckpt-prune", "ckpt", "prune", str(ckpts), "--keep", "1", "--dry-run", "--json", cwd=cwd)
    json_of(out, "run-scaling", "run", "--scaling", "1", "--json", "--run-dir", str(cwd / "scaling"), "--",
            sys.executable, str(TINY_GPT), "--steps", "3", cwd=cwd)
    return out


def _node_and_data(cwd: Path) -> Outputs:
    """check on a captured bundle and on a bundle collected here; data pack and bench on a small corpus."""
    out: Outputs = {}
    json_of(out, "check", "check", "--bundle", str(BUNDLES / "p4d"), "--json", cwd=cwd)
    trainready("check", "collect", "--out", "collected", cwd=cwd)
    file_of(out, "check-bundle", cwd / "collected" / "manifest.json")
    corpus = cwd / "corpus"
    corpus.mkdir()
    for part in range(3):
        (corpus / f"part{part}.jsonl").write_text("".join(json.dumps({"text": f"doc {part} {n} " * 20}) + "\n"
                                                          for n in range(100)))
    json_of(out, "data-pack", "data", "pack", str(corpus), "--format", "jsonl", "--out", "packed", "--shard-size",
            "64KiB", "--json", cwd=cwd)
    file_of(out, "data-index", cwd / "packed" / "index.json")
    json_of(out, "data-bench", "data", "bench", "packed", "--workers", "1", "--seconds", "1", "--plan-tokens-per-s",
            "1", "--json", cwd=cwd)
    return out


def _cloud(cwd: Path, moto_url: str) -> Outputs:
    """account against moto's server: what moto lacks (quotas, Capacity Blocks) reads unknown, in the same shape."""
    aws = {"AWS_ENDPOINT_URL": moto_url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": str(cwd / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(cwd / "none"),
           "TRAINREADY_CACHE_DIR": str(cwd / "cache")}
    proc = subprocess.run([sys.executable, "-m", "trainready", "account", "--instance", "p5.48xlarge", "--nodes", "2",
                           "--region", "us-east-1,eu-west-1", "--json"], cwd=cwd, capture_output=True, text=True,
                          timeout=180, env={**{k: v for k, v in env_for_run().items() if not k.startswith("AWS_")}, **aws})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return {"account": [("account --json against moto", parse(proc.stdout))]}


PRODUCER = {"catalog-gpus": "planning", "catalog-instances": "planning", "catalog-models": "planning",
            "estimate": "planning", "plan": "planning", "job": "planning", "diagnose": "planning", "error": "planning",
            "calibration": "planning", "track-record": "planning",
            "run-result": "training", "run-summary": "training", "run-info": "training", "run-stop": "training",
            "run-telemetry": "training", "run-scaling": "training", "ckpt-manifest": "training",
            "ckpt-tensor-index": "training", "ckpt-lease": "training", "ckpt-ls": "training", "ckpt-verify": "training",
            "ckpt-pull": "training", "ckpt-prune": "training",
            "check": "node_and_data", "check-bundle": "node_and_data", "data-pack": "node_and_data",
            "data-index": "node_and_data", "data-bench": "node_and_data", "account": "cloud"}


def test_every_schema_has_a_real_output_below():
    assert sorted(PRODUCER) == sorted(SCHEMAS)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_real_output_validates_against_the_documented_schema(name, request):
    assert name in PRODUCER, f"{name}: add a command that produces it to PRODUCER"
    documents = request.getfixturevalue(PRODUCER[name]).get(name, [])
    assert documents, f"{name}: no output produced"
    validator = jsonschema.Draft202012Validator(strict(json.loads((DOCS / f"{name}.schema.json").read_text())))
    for origin, document in documents:
        problems = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator.iter_errors(document)]
        assert problems == [], f"{name} from `{origin}` does not match docs/schemas/{name}.schema.json:\n" + \
            "\n".join(problems[:10])
        assert document["schema_version"] == VERSIONS.get(name, 1), origin  # job files and each telemetry record too
