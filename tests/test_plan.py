"""`plan`: search, ranking, exclusions with reasons, constraints, recipe."""

import re

import pytest

from trainready.errors import UsageError
from trainready.plan.job import JobSpec
from trainready.plan.search import PlanRequest, plan
from trainready.plan.units import hours_text


def run(catalog, **kw):
    job_kw = {k: kw.pop(k) for k in list(kw) if k in JobSpec.model_fields}
    job_kw.setdefault("model", "llama-2-13b")
    job_kw.setdefault("tokens", 2e9)
    return plan(PlanRequest(job=JobSpec(**job_kw), **kw), catalog)


def test_ranked_by_cost_with_reasons_and_recipe(catalog):
    r = run(catalog)
    assert len(r.rows) == 5
    costs = [row.estimate.cost.total_usd for row in r.rows]
    assert costs == sorted(costs)
    # without sequence parallelism (the default stack's TP is transformers' plan) tp 2 is within the robustness
    # margin of the simpler ZeRO-2 row, which the search prefers and says so
    assert r.rows[0].why.startswith(("cheapest", "simpler than the cheapest"))
    for row in r.rows:
        assert row.estimate.memory.per_gpu_gib.peak <= row.estimate.memory.gpu_gib * 0.9 + 1e-9
    assert r.recipe is not None and r.recipe.torchrun[0].startswith("torchrun")
    assert r.searched > 100 and r.schema_version == 1
    shown = {row.estimate.setup.instance for row in r.rows}
    listed = shown | {x.instance for x in r.excluded} | {a.instance for a in r.others}
    assert len(listed) == len(catalog.instances)  # every instance is accounted for


def test_ranked_by_time(catalog):
    r = run(catalog, by="time", top=3)
    hours = [row.estimate.time.train_hours for row in r.rows]
    assert hours == sorted(hours) and r.rows[0].why.startswith("fastest")


def test_70b_full_on_g5_explains_why_not(catalog):
    r = run(catalog, model="llama-2-70b", instances=["g5.48xlarge", "p4de.24xlarge"], max_nodes=1)
    reasons = {x.instance: x.reason for x in r.excluded}
    g5 = reasons["g5.48xlarge"]
    assert "1.10 TB of model states" in g5 and "even with ZeRO-3, which needs >= " in g5 and "nodes over 100 Gbps" in g5
    assert "host RAM" in g5  # offloading would need more than its 768 GiB


def test_constraints(catalog):
    cheap = run(catalog, top=1).rows[0].estimate.cost.total_usd
    r = run(catalog, max_usd=cheap * 0.5)
    assert not r.rows and any("--max-usd" in x.reason for x in r.excluded)
    r = run(catalog, deadline_hours=3, by="time")
    assert all(row.estimate.time.train_hours <= 3 for row in r.rows)
    r = run(catalog, clouds=["aws"], min_gpu_mem_gib=70)
    assert all(row.estimate.setup.instance.startswith("p") for row in r.rows)
    assert all(row.estimate.memory.gpu_gib >= 70 for row in r.rows)
    with pytest.raises(UsageError, match="unknown cloud"):
        run(catalog, clouds=["oracle"])


def test_lora_plans_fit_small_gpus(catalog):
    r = run(catalog, model="llama-3-8b", method="qlora", instances=["g5.xlarge", "g6.12xlarge"])
    assert r.rows and r.rows[0].estimate.setup.method == "qlora"


def test_spot_ranking_uses_spot_prices(catalog):
    r = run(catalog, spot=True, top=3)
    for row in r.rows:
        assert row.estimate.cost.pricing.model == "spot"


def _cheapest_by_instance(r) -> dict[str, float]:
    """Each instance's cheapest setup as the unconstrained plan ranks it (a row or "Also fits"): the pessimistic end
    of an assumed GPU's range, which rows carry in their confidence; "Also fits" shows such an instance's point
    (None here: the limit's quote says it used the pessimistic end)."""
    best: dict[str, float | None] = {}
    for row in r.rows:
        ranged = row.estimate.confidence.total_usd
        name, usd = row.estimate.setup.instance, ranged.pessimistic if ranged else row.estimate.cost.total_usd
        best[name] = min(best.get(name) or usd, usd)
    for alt in r.others:
        best.setdefault(alt.instance, None if alt.assumed else alt.total_usd)
    return best


def test_max_usd_exclusions_quote_each_instance_true_cheapest_cost(catalog):
    free = _cheapest_by_instance(run(catalog, tokens=2e10))
    limited = run(catalog, tokens=2e10, max_usd=10)
    assert not limited.rows
    quoted = {x.instance: x.reason for x in limited.excluded if "--max-usd" in x.reason}
    assert set(quoted) == set(free)  # every instance that fits is excluded by the limit alone
    for name, usd in free.items():
        # the quote is the cheapest setup of all, which the shown row may trade for a simpler one within the
        # ranking's margin: never above what the plan shows, and a limit just above it admits a row
        m = re.search(r"costs \$([\d,.]+)( \(the pessimistic end of its range, which the limits use\))? > --max-usd "
                      r"\$10\.00", quoted[name])
        assert m, (name, quoted[name])
        cheapest = float(m.group(1).replace(",", ""))
        if usd is None:  # an assumed GPU in "Also fits": its point is shown, its pessimistic end quoted, and said
            assert m.group(2), quoted[name]
            continue
        assert cheapest <= usd + 0.5, (name, quoted[name], usd)
    for name in sorted(free)[:3]:
        cheapest = float(re.search(r"costs \$([\d,.]+)", quoted[name]).group(1).replace(",", ""))
        assert run(catalog, tokens=2e10, max_usd=cheapest * 1.001 + 1, instances=[name]).rows, name


def test_max_usd_compares_the_cost_the_row_shows(catalog):
    first = run(catalog, top=1).rows[0].estimate
    cost = first.cost.total_usd
    kept = run(catalog, top=1, max_usd=cost * 1.0001).rows[0].estimate
    assert (kept.setup, kept.cost.total_usd) == (first.setup, cost)
    r = run(catalog, top=1, max_usd=cost * 0.9999)  # the #1 row costs more than this: it must go
    assert all(row.estimate.cost.total_usd <= cost * 0.9999 for row in r.rows)
    assert first.setup.instance in {x.instance for x in r.excluded} | {a.instance for a in r.others} | {
        row.estimate.setup.instance for row in r.rows}


def test_deadline_exclusions_quote_the_fastest_time(catalog):
    free = run(catalog, by="time", top=100, instances=["p4d.24xlarge"])
    fastest = min(row.estimate.time.train_hours for row in free.rows)
    # a shown row may be a simpler setup within the margin of a faster one ("simpler than the fastest: ... is 4%
    # faster"): a deadline below the shown rows then finds that one, and a deadline below it nothing
    for _ in range(3):
        r = run(catalog, by="time", instances=["p4d.24xlarge"], deadline_hours=fastest * 0.99)
        if not r.rows:
            break
        assert "simpler than the fastest" in free.rows[0].why
        fastest = min(row.estimate.time.train_hours for row in r.rows)
    assert not r.rows
    assert r.excluded[0].reason.startswith(f"fits, but its fastest setup ({free.rows[0].estimate.setup.nodes} nodes) "
                                           f"takes {hours_text(fastest)} > --deadline-hours {fastest * 0.99:g}")


def test_plan_global_batch_that_no_data_parallel_size_divides_names_valid_ones(catalog):
    r = run(catalog, model="llama-2-7b", global_batch=3, instances=["p4d.24xlarge"])
    assert not r.rows
    assert r.excluded[0].reason == "global batch 3 is not divisible by data-parallel size 8 (nearest valid: 8)"


def test_no_price_reason_says_it_once(catalog):
    r = run(catalog, instances=["p5e.48xlarge"])
    assert r.excluded[0].reason == ("fits, but no on-demand price in the catalog (sold as Capacity Blocks; not offered "
                                    "in us-east-1); give --usd-per-hour or try --spot")


def test_a_mistyped_region_is_a_usage_error_not_nothing_fits(catalog):
    with pytest.raises(UsageError) as exc:
        run(catalog, region="us-est-1")
    assert exc.value.exit_code == 2 and str(exc.value).startswith("unknown region 'us-est-1'. Did you mean: ")
    assert "us-east-1" in str(exc.value).split("?")[0]


def test_a_region_without_prices_says_where_the_prices_are(catalog):
    r = run(catalog, region="us-west-2", instances=["p4d.24xlarge"])
    assert not r.rows
    assert r.excluded[0].reason == ("fits, but no on-demand price in us-west-2 in the catalog (it has one in "
                                    "us-east-1); give --usd-per-hour or try --spot")
    r = run(catalog, region="US-East-1", instances=["p4d.24xlarge"])  # spelled loosely: the catalog's region
    assert r.rows[0].estimate.cost.pricing.region == "us-east-1"


def test_recipe_config_lines_fit_80_columns_for_every_strategy(catalog):
    from trainready.plan.recipes import framework_for, recipe_for
    from trainready.plan.setup import resolve

    kinds = set()
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        for offload in ("none", "optimizer", "optimizer+params"):
            for ckpt in ("none", "full"):
                for tp, pp in ((1, 1), (2, 1), (1, 2)):
                    job = JobSpec(model="llama-2-13b", instance="p4d.24xlarge", gpus=16, strategy=strategy,
                                  offload=offload, activation_checkpointing=ckpt, tp=tp, pp=pp)
                    try:
                        s = resolve(job, catalog)
                    except UsageError:
                        continue  # an impossible combination (offload with ddp...)
                    if framework_for(s)[0] is None:
                        continue  # no framework runs it (zero2 with pipeline stages): the search skips it
                    rc = recipe_for(s)
                    kinds.add((strategy, rc.config_kind))
                    assert max(map(len, rc.config.splitlines())) <= 79, (strategy, offload, ckpt, tp, pp)
    # ddp with tensor or pipeline parallelism goes through DeepSpeed at ZeRO stage 0 (was a KeyError)
    assert ("ddp", "deepspeed-json") in kinds
    s = resolve(JobSpec(model="llama-2-13b", instance="p4d.24xlarge", strategy="ddp", pp=2), catalog)
    assert '"stage": 0' in recipe_for(s).config


def test_plan_interleaves_a_pipelined_row_only_where_it_pays(catalog):
    """A pipelined row is tried with 2 and 4 virtual stages per rank; one that is chosen is the estimate of
    that very layout, at least COMPLEXITY (5%) faster than the same row in plain 1F1B, and splits the layers
    evenly with micro-batches in whole groups of pp."""
    from trainready.plan.estimate import estimate_setup
    from trainready.plan.search import COMPLEXITY

    r = run(catalog, model="llama-2-70b", tokens=1e10, framework="megatron")
    interleaved = [row for row in r.rows if row.estimate.setup.pp_virtual > 1]
    assert interleaved, [(row.estimate.setup.pp, row.estimate.setup.pp_virtual) for row in r.rows]
    for row in interleaved:
        st = row.estimate.setup
        assert 80 % (st.pp * st.pp_virtual) == 0 and st.grad_accum % st.pp == 0  # llama-2-70b: 80 layers
        job = JobSpec(model="llama-2-70b", instance=st.instance, gpus=st.gpus, tp=st.tp, pp=st.pp,
                      pp_virtual=st.pp_virtual, strategy=st.strategy, micro_batch=st.micro_batch,
                      global_batch=st.global_batch, activation_checkpointing=st.activation_checkpointing,
                      tokens=1e10)
        from trainready.plan.setup import resolve

        plain = estimate_setup(resolve(job.model_copy(update={"pp_virtual": 1}), catalog))
        assert row.estimate.throughput.tokens_per_s >= plain.throughput.tokens_per_s * (1 + COMPLEXITY)


def test_plan_keeps_tp_inside_a_node_that_is_not_a_power_of_two(tmp_path):
    """A user's catalog with 6-GPU nodes: tp 4 would span two nodes (ranks 4-7), which `estimate` refuses
    (setup._check_parallel); the search tried it all the same, and its best row (tp 4 x pp 4 x 16 nodes)
    saved by --save was a job `estimate --job` refused."""
    from trainready.catalog import load_catalog
    from trainready.plan.setup import resolve

    user = tmp_path / "six.toml"
    user.write_text('[[instance]]\nname = "six-h100"\ncloud = "dc"\ngpu = "h100-80gb"\ngpu_count = 6\n'
                    'network_gbps = 3200\ntopology = "nvswitch"\n')
    catalog = load_catalog(user)
    r = plan(PlanRequest(job=JobSpec(model="llama-2-70b", tokens=1e10, global_batch=384, usd_per_hour=60.0),
                         instances=["six-h100"], framework="megatron", top=20), catalog)
    assert r.rows and any(row.estimate.setup.tp > 1 for row in r.rows)
    for row in r.rows:
        st = row.estimate.setup
        assert 6 % st.tp == 0, (st.tp, st.pp, st.nodes)
        job = JobSpec(model="llama-2-70b", instance=st.instance, gpus=st.gpus, tp=st.tp, pp=st.pp,
                      pp_virtual=st.pp_virtual if st.pp_virtual > 1 else None, strategy=st.strategy,
                      micro_batch=st.micro_batch, global_batch=st.global_batch,
                      activation_checkpointing=st.activation_checkpointing, usd_per_hour=60.0)
        assert resolve(job, catalog).tp == st.tp  # the row is one `estimate` takes


def test_plan_tries_uneven_stages_beyond_the_largest_even_split(catalog):
    """Llama 3.1 405B has 126 layers: only pp 2 splits them evenly, too few stages to hold it on 16 nodes under
    Megatron's ZeRO-1; uneven pp 4 and 8 (the extra layers on the first stages) make it fit."""
    r = run(catalog, model="llama-3.1-405b", tokens=1e10, framework="megatron")
    assert r.rows
    assert any(row.estimate.setup.pp in (4, 8) for row in r.rows), [row.estimate.setup.pp for row in r.rows]
