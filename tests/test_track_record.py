"""The planner's track record (plan/track_record.py): quoted from the current model's errors on measured runs,
narrowest regime with enough runs first, and never from a file that does not hold what it must."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_modules import bench_module
from cloud_stubs import cli_run
from trainready.catalog import load_catalog
from trainready.plan import track_record as tr
from trainready.plan.job import JobSpec
from trainready.plan.setup import resolve

ROOT = Path(__file__).resolve().parents[1]
CATALOG = load_catalog()




def _row(id_: str, err: float, arch: str = "hopper", precision: str = "16-bit", kind: str = "dense",
         context: str = "standard", stack: str = "hf-trainer") -> tr.RecordRow:
    return tr.RecordRow(id=id_, source="test", signed_error_pct=err,
                        regime=tr.Regime(kind=kind, context=context, precision=precision, arch=arch, stack=stack,
                                         dispatcher="none"))


def _setup(**kw):
    return resolve(JobSpec(**{"model": "llama-3.1-8b", "gpu": "h100-80gb", "gpus": 8, **kw}), CATALOG)


def test_the_committed_record_is_what_the_model_gives_now():
    bench = bench_module("track_record")
    committed = (ROOT / "src" / "trainready" / "plan" / "data" / "track_record.json").read_text(encoding="utf-8")
    rows = bench.records()
    assert bench.document(rows) == committed, "stale: run python bench/track_record.py and commit the file"
    # every run the two benches count, once: dense and MoE, long and standard sequences, several architectures
    assert len(rows) >= 200 and len({r.id for r in rows}) == len(rows)
    assert {r.regime.kind for r in rows} == {"dense", "moe"}
    assert {r.regime.context for r in rows} == {"standard", "long"}
    assert {"ampere", "hopper", "blackwell"} <= {r.regime.arch for r in rows}
    # docs/planner.md quotes the regimes as `bench/track_record.py --markdown` prints them
    docs = (ROOT / "docs" / "planner.md").read_text(encoding="utf-8")
    assert bench.markdown(rows) in docs and bench.memory_markdown(rows) in docs, \
        "stale: paste python bench/track_record.py --markdown (both tables) into docs/planner.md"


def test_the_committed_file_loads_and_every_regime_of_the_catalog_gets_a_record():
    assert tr._rows() is not None
    for gpu in ("a100-80gb", "h100-80gb", "b200", "l4"):
        rec = tr.track_record(_setup(gpu=gpu))
        assert rec is not None and rec.runs >= tr.MIN_RUNS


def test_the_narrowest_regime_with_enough_runs_is_quoted_and_the_few_narrower_runs_are_named():
    hopper = [_row(f"h{i}", e) for i, e in enumerate([1, -2, 3, -4, 5, 6, 7, 8, 9, 10])]
    blackwell = [_row("b1", 36.0, arch="blackwell"), _row("b2", -12.0, arch="blackwell")]
    rows = tuple(hopper + blackwell)
    on_hopper = tr.track_record(_setup(), rows)
    assert on_hopper.runs == 10 and "Hopper" in on_hopper.regime and on_hopper.narrower is None
    assert on_hopper.median_abs_error_pct == pytest.approx(5.5)
    assert on_hopper.p90_abs_error_pct == 9  # nearest rank: the ceil(0.9 x 10) = 9th smallest
    assert on_hopper.signed_median_pct == pytest.approx(5.5)
    assert on_hopper.worst_run == "h9" and on_hopper.worst_signed_error_pct == 10
    on_blackwell = tr.track_record(_setup(gpu="b200"), rows)
    assert on_blackwell.runs == 12 and "Blackwell" not in on_blackwell.regime
    assert "Blackwell" in on_blackwell.narrower and "(2: -12%, +36%)" in on_blackwell.narrower
    assert on_blackwell.worst_run == "b1"
    assert on_blackwell.narrower_errors_pct == [-12.0, 36.0] and on_blackwell.p90_abs_error_pct == 12
    assert on_blackwell.regime_measured
    # loose: the broad regime's 90th percentile is 12%, but one of the two runs on the setup's own GPUs was +36%
    assert "too few" in tr.text(on_blackwell) and tr.wide(on_blackwell)
    assert not tr.wide(tr.track_record(_setup(gpu="b200"), tuple(hopper + blackwell[1:])))
    on_ada = tr.track_record(_setup(gpu="l4"), rows)
    assert on_ada.narrower == "no measured dense BF16/FP16 runs with sequences under 32k on Ada GPUs"
    assert not on_ada.regime_measured and tr.wide(on_ada)  # nothing measured its regime: a warning, not reassurance
    assert not tr.wide(on_hopper)


def test_an_unmeasured_regime_still_names_the_few_runs_of_a_broader_one():
    rows = tuple([_row(f"m{i}", 10.0, kind="moe") for i in range(8)] + [_row("long", 41.0, kind="moe", context="long",
                                                                             precision="fp8", arch="blackwell")])
    moe = resolve(JobSpec(model="mixtral-8x7b", gpu="h100-80gb", gpus=8, ep=8, seq_len=65536, cp=2), CATALOG)
    rec = tr.track_record(moe, rows)
    assert rec.runs == 9 and not rec.regime_measured and rec.narrower_errors_pct == [41.0]
    assert rec.narrower.startswith("no measured MoE BF16/FP16 runs with long sequences")
    assert "too few measured MoE runs with long sequences" in rec.narrower and "(1: +41%)" in rec.narrower


def test_each_stack_is_quoted_its_own_runs_where_it_has_enough_and_named_where_it_has_few():
    # one regime, two stacks that miss in opposite directions (as torchtitan's and Megatron's long-context FP8
    # runs on Hopper do): neither user is quoted the other's lean without being told
    titan = [_row(f"t{i}", e, precision="fp8", context="long", stack="torchtitan")
             for i, e in enumerate([26, 34, 48, 63, 65, -6, 1, 30])]
    rows = tuple(titan + [_row("m1", -15.0, precision="fp8", context="long", stack="megatron")])
    long_fp8 = {"precision": "fp8", "seq_len": 65536, "cp": 2}
    on_titan = tr.track_record(_setup(stack="torchtitan", **long_fp8), rows)
    assert on_titan.runs == 8 and on_titan.regime.endswith("on Hopper GPUs under torchtitan")
    assert on_titan.narrower is None and on_titan.signed_median_pct == pytest.approx(32.0)
    on_megatron = tr.track_record(_setup(stack="megatron", **long_fp8), rows)
    assert on_megatron.runs == 9 and on_megatron.regime.endswith("on Hopper GPUs (8 of 9 under torchtitan)")
    assert "under megatron to quote alone (1: -15%)" in on_megatron.narrower
    assert on_megatron.narrower_errors_pct == [-15.0] and on_megatron.regime_measured
    # a stack with no run of its own is quoted the regime's runs, not called unmeasured
    on_trainer = tr.track_record(_setup(stack="hf-trainer", **long_fp8), rows)
    assert on_trainer.runs == 9 and on_trainer.narrower is None and on_trainer.regime_measured
    assert on_trainer.regime.endswith("(8 of 9 under torchtitan)")  # the lean it reads is mostly torchtitan's
    assert "(" not in tr.track_record(_setup(stack="torchtitan", precision="fp8"), rows).regime  # most are its own stack's
    assert tr.regime_of(_setup(stack="torchtitan")).stack == "torchtitan"


def test_the_lean_is_said_only_where_there_is_one():
    even = tr.summarize([_row("a", -0.4), _row("b", 0.0), _row("c", 0.3)], "x")
    assert "leaned neither way" in tr.text(even)
    assert "leaned pessimistic (-3% median)" in tr.text(tr.summarize([_row("a", -3.0)], "x"))


def test_under_ten_runs_the_worst_stands_for_the_spread():
    rows = tuple(_row(f"m{i}", e, kind="moe") for i, e in enumerate([20, 25, -30, 40, 10, 12, 48, 5]))
    moe = resolve(JobSpec(model="mixtral-8x7b", gpu="h100-80gb", gpus=8, ep=8), CATALOG)
    rec = tr.track_record(moe, rows)
    assert rec.runs == 8 and rec.p90_abs_error_pct is None and rec.worst_signed_error_pct == 48
    assert "at worst 48%" in tr.text(rec) and tr.wide(rec)
    assert tr.track_record(moe, rows[:7]) is None  # fewer than MIN_RUNS even for MoE as a whole: no record


def test_long_sequences_and_context_parallelism_are_their_own_regime():
    assert tr.regime_of(_setup(seq_len=32768)).context == "long"
    assert tr.regime_of(_setup(seq_len=8192, cp=2)).context == "long"
    assert tr.regime_of(_setup(seq_len=8192)).context == "standard"
    assert tr.regime_of(_setup(precision="fp8")).precision == "fp8"


GOOD = {"schema_version": 3, "generated_by": "bench/track_record.py",
        "rows": [{"id": "a", "source": "s", "signed_error_pct": 3.0, "memory_signed_error_pct": -4.0,
                  "memory_transient_ratio": 1.1,
                  "regime": {"kind": "dense", "context": "standard", "precision": "fp8", "arch": "hopper",
                             "stack": "torchtitan", "dispatcher": "none"}}]}


def _with(path: tuple, value) -> str:
    doc = json.loads(json.dumps(GOOD))
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return json.dumps(doc)


@pytest.mark.parametrize("text", [
    _with(("schema_version",), 1),  # written before regimes named their stack: its rows would match none
    _with(("schema_version",), 2),  # written before runs carried their memory error
    _with(("schema_version",), 4),
    _with(("rows", 0, "memory_signed_error_pct"), -100.0),  # a model peak of nothing: no ratio to scale by
    _with(("rows", 0, "memory_signed_error_pct"), float("inf")),
    _with(("rows", 0, "memory_transient_ratio"), -1.0),
    _with(("rows", 0, "memory_transient_ratio"), 1e9),
    _with(("rows", 0, "memory_transient_ratio"), "1.1"),
    _with(("rows", 0, "regime", "dispatcher"), "[bold]deepep[/]"),
    _with(("rows", 0, "regime", "dispatcher"), None),
    _with(("rows", 0, "regime", "dispatcher"), "deepep"),  # a dense run has none: it would hide the dense peaks
    _with(("rows", 0, "memory_transient_ratio"), None),  # half a memory comparison: the run would drop out unseen
    _with(("rows", 0, "signed_error_pct"), float("nan")),
    _with(("rows", 0, "signed_error_pct"), "3"),
    _with(("rows", 0, "regime", "kind"), "hybrid"),
    _with(("rows", 0, "regime", "arch"), "[bold]hopper[/]"),
    _with(("rows", 0, "regime", "stack"), "[bold]torchtitan[/]"),
    _with(("rows", 0, "regime", "stack"), ""),
    _with(("rows", 0, "regime", "stack"), 7),
    _with(("rows", 0, "regime", "stack"), "foo"),  # no stack of this release: its runs would match no setup
    _with(("rows", 0, "extra"), 1),
    _with(("rows",), []),
    _with(("rows", 0, "id"), ""),
    _with(("schema_version",), True),
    _with(("schema_version",), 3.0),
    json.dumps({**GOOD, "rows": GOOD["rows"] * 2}),  # a run counted twice
    "not json", "[" * 50_000, '{"schema_version": 3}',
])
def test_a_file_that_does_not_hold_what_it_must_gives_no_record(text):
    assert tr.parse(text) is None
    assert tr.parse(json.dumps(GOOD)) is not None


def test_a_file_beyond_the_size_cap_is_not_read_whole(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    big = tmp_path / "data" / "track_record.json"
    big.write_text(json.dumps(GOOD) + " " * tr.MAX_FILE_BYTES)  # valid JSON, but larger than any record of ours
    monkeypatch.setattr(tr.resources, "files", lambda package: tmp_path)
    tr._rows.cache_clear()
    try:
        assert tr._rows() is None
        big.write_text(json.dumps(GOOD))
        tr._rows.cache_clear()
        assert tr._rows() is not None and len(tr._rows()) == 1
    finally:
        tr._rows.cache_clear()


def test_estimate_quotes_the_record_and_warns_where_it_is_loose(monkeypatch):
    out = json.loads(cli_run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus", "8",
                             "--json").stdout)
    rec = out["confidence"]["track_record"]
    assert rec["runs"] >= tr.MIN_RUNS and "Hopper" in rec["regime"] and rec["median_abs_error_pct"] >= 0
    human = cli_run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus", "8", columns=80).stdout
    assert "track record: on" in human.replace("\n", " ")
    moe = cli_run("estimate", "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--gpus", "8", "--ep", "8",
                  "--json")
    warnings = json.loads(moe.stdout)["warnings"]
    record = json.loads(moe.stdout)["confidence"]["track_record"]
    assert record["regime"].startswith("MoE")
    assert any(w.startswith("loose track record:") for w in warnings) == tr.wide(tr.TrackRecord(**record))
    assert tr.wide(tr.TrackRecord(**record))  # 9 MoE runs on Hopper, the worst 48% off
    plan = cli_run("plan", "--model", "mixtral-8x7b", "--tokens", "1e9", "--instances", "p5.48xlarge",
                   columns=80).stdout.replace("\n", " ")
    assert "warning: loose track record (#1): on" in plan


def test_a_calibrated_estimate_does_not_quote_the_shipped_models_record(tmp_path):
    from test_calibration import H200_NODE, write_bundle

    write_bundle(tmp_path / "bundle", 400.0, 300.0)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    args = ("estimate", "--model", "llama-3-8b", "--instance", H200_NODE, "--json")
    plain = json.loads(cli_run(*args, cwd=tmp_path, env=env).stdout)
    assert plain["confidence"]["track_record"] is not None
    calibrated = json.loads(cli_run(*args, "--calibrate", str(tmp_path / "bundle"), cwd=tmp_path, env=env).stdout)
    assert calibrated["confidence"]["source"] != plain["confidence"]["source"]  # the fitted factors were used
    assert calibrated["confidence"]["track_record"] is None


def test_without_a_readable_record_the_estimate_says_nothing_of_one(monkeypatch):
    monkeypatch.setattr(tr, "_rows", lambda: None)
    tr._committed.cache_clear()
    try:
        out = json.loads(cli_run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpus", "8",
                                 "--json").stdout)
        assert out["confidence"]["track_record"] is None
        assert not any("track record" in w for w in out["warnings"])
    finally:
        tr._committed.cache_clear()


def test_the_90th_percentile_is_the_nearest_rank_one_the_benches_share():
    import math

    assert tr.p90([float(x) for x in range(1, 11)]) == 9.0  # ceil(0.9 x 10) = the 9th smallest
    assert tr.p90([float(x) for x in range(7, 0, -1)]) == 7.0  # ceil(6.3) = 7: with 7 runs, the worst
    assert tr.p90([3.0]) == 3.0
    assert math.isnan(tr.p90([]))
    for name in ("plan_accuracy", "plan_accuracy_2024"):  # the two accuracy benches count it the same way
        assert bench_module(name).p90 is tr.p90
