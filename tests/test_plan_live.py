"""`plan --live`: rows held against an account on moto's server (Stubber for quotas and Price List products):
re-ranked by live prices, blocked rows excluded with the reason, "needs a quota increase" where that is the
only obstacle, data gravity, the 90th-percentile worst case; and the fallback to the catalog, in one line,
without credentials or boto3. Nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
import math

import boto3
import jsonschema
import numpy as np
import pytest
from cloud_stubs import World, aws_env, invoke, no_internet, price_list, quota, usage

from trainready.catalog.quotas import aws_limits
from trainready.plan.search import PlanResult
from trainready.plan.worst_case import lost_hours_quantile, worst_case_hours

PLAN = ["plan", "--model", "llama-2-7b", "--method", "lora", "--tokens", "1e9", "--max-nodes", "2",
        "--instances", "p4d.24xlarge,p5.48xlarge,a2-highgpu-8g"]
SCHEMA = PlanResult.model_json_schema(mode="serialization")
PRICES = {("p4d.24xlarge", "us-east-1"): "21.9576000000", ("p4d.24xlarge", "us-west-2"): "19.3000000000",
          ("p5.48xlarge", "us-east-1"): "55.0400000000", ("p5.48xlarge", "us-west-2"): "52.0000000000"}
GB = 10**9


@pytest.fixture(scope="module")
def server():
    from s3server import MotoServer

    srv = MotoServer()
    boto3.client("ec2", endpoint_url=srv.url, region_name="us-east-1", aws_access_key_id="x",
                 aws_secret_access_key="y").describe_instance_types(InstanceTypes=["p5.48xlarge"])  # moto's slow first
    s3 = boto3.client("s3", endpoint_url=srv.url, region_name="us-east-1", aws_access_key_id="x",
                      aws_secret_access_key="y")
    s3.create_bucket(Bucket="ds-east")
    yield srv
    srv.stop()


@pytest.fixture
def net(monkeypatch):
    with no_internet(monkeypatch) as tried:
        yield tried
    assert tried == [], f"a test tried to leave 127.0.0.1: {tried}"


def live_json(*args: str) -> dict:
    code, out, err = invoke(*PLAN, *args, "--json")
    assert code == 0 and "Traceback" not in err, err
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    return doc


def world(limits: dict[str, float], dataset_bytes: list[int] | None = None) -> World:
    w = World()
    code = aws_limits().quota_for("p5.48xlarge", "on-demand")
    for region, limit in limits.items():
        # p4d and p5 share the P quota; rows are asked concurrently, so a region may ask more than once
        w.respond("service-quotas", region, "get_service_quota", quota(code.code, code.name, limit, "P/OnDemand", region),
                  repeat=4)
        w.respond("cloudwatch", region, "get_metric_statistics", usage(None), repeat=4)
    for (itype, region), usd in PRICES.items():
        w.respond("pricing", "us-east-1", "get_products", price_list(itype, region, usd), match=_for(itype, region),
                  repeat=2)
    if dataset_bytes is not None:  # ListObjectsV2 of a dataset larger than moto should hold
        w.respond("s3", "us-east-1", "list_objects_v2", {
            "IsTruncated": False, "Name": "ds-east", "Prefix": "tokens/", "KeyCount": len(dataset_bytes), "MaxKeys": 1000,
            "Contents": [{"Key": f"tokens/shard-{i:06d}.tar", "Size": n, "ETag": '"9b2cf535f27731c974343645a3985328"',
                          "StorageClass": "STANDARD"} for i, n in enumerate(dataset_bytes)]})
    return w


def _for(itype: str, region: str):
    """A Price List answer is for the type and region its filters ask for."""
    def match(params: dict) -> bool:
        filters = {f["Field"]: f["Value"] for f in params["Filters"]}
        return filters.get("instanceType") == itype and filters.get("regionCode") == region
    return match


def rows_by_setup(doc: dict) -> dict[tuple[str, int], dict]:
    return {(r["estimate"]["setup"]["instance"], r["estimate"]["setup"]["nodes"]): r for r in doc["rows"]}


# ---------------------------------------------------------------------------- no account: the catalog, one line

def test_without_credentials_the_catalog_answers_in_one_line(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, server.url, creds=False)
    doc = live_json("--live")
    assert doc["live"]["live"] is False and "no AWS credentials found" in doc["live"]["reason"]
    assert doc["notes"][-1] == doc["live"]["reason"]
    for row in doc["rows"]:
        x = row["live"]
        assert (x["attainable"], x["price_source"]) == (None, "catalog")
        assert x["usd_per_hour"] == row["estimate"]["cost"]["usd_per_hour"]
        assert x["total_usd"] == pytest.approx(row["estimate"]["cost"]["total_usd"], rel=1e-9)
        assert x["worst_case_usd"] >= x["total_usd"]
    code, out, err = invoke(*PLAN, "--live")
    assert code == 0 and out.count("plan --live: catalog prices, nothing checked live") == 2  # notes + live header


def test_without_network_the_catalog_answers(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, "http://127.0.0.1:9", attempts=1)  # nothing listens on port 9 (discard)
    doc = live_json("--live")
    assert doc["live"]["live"] is False and "cannot ask AWS who you are" in doc["live"]["reason"]
    assert "cannot reach AWS" in doc["live"]["reason"]
    assert {r["live"]["price_source"] for r in doc["rows"]} == {"catalog"}


def test_without_boto3_the_catalog_answers(server, monkeypatch, tmp_path, net):
    from trainready.cloud import live

    aws_env(monkeypatch, tmp_path, server.url)
    monkeypatch.setattr(live, "missing_boto", lambda: "boto3 is not installed: pip install 'trainready[s3]'")
    doc = live_json("--live")
    assert doc["live"]["live"] is False and "boto3 is not installed" in doc["live"]["reason"]
    assert [r["rank"] for r in doc["rows"]] == [1, 2, 3, 4, 5]


def test_unknown_region_is_exit_2(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, server.url)
    code, out, err = invoke(*PLAN, "--live", "--regions", "us-east-1,eu-wst-1")
    assert code == 2 and err.startswith("error: unknown region 'eu-wst-1'. Did you mean: ") and "eu-west-1" in err
    code, out, err = invoke(*PLAN, "--live", "--data", "/local/data")
    assert code == 2 and "--data '/local/data': give an s3://bucket/prefix URL" in err


# ---------------------------------------------------------------------------- an account

def test_live_prices_rerank_and_quota_blocks(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, server.url, attempts=1)
    world({"us-east-1": 192, "us-west-2": 96}).install(monkeypatch)
    doc = live_json("--live", "--regions", "us-east-1,us-west-2")
    assert doc["live"]["live"] is True and doc["live"]["regions"] == ["us-east-1", "us-west-2"]
    rows = rows_by_setup(doc)
    # p4d x1 needs 96 vCPUs: both regions launch it; us-west-2's live price is lower
    p4d = rows[("p4d.24xlarge", 1)]["live"]
    assert (p4d["attainable"], p4d["region"], p4d["price_source"], p4d["usd_per_hour"]) == \
        (True, "us-west-2", "live", 19.30)
    assert p4d["price_as_of"] == "2026-11-20T18:04:43Z" and p4d["quota_headroom_vcpus"] == 96
    est = rows[("p4d.24xlarge", 1)]["estimate"]
    assert p4d["total_usd"] == pytest.approx(19.30 * est["time"]["train_hours"])
    assert p4d["azs"] == ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"]  # moto's offerings
    # p5 x2 needs 384: 192 free in us-east-1 is half of it (kept: "needs a quota increase"), us-west-2 far below
    p5x2 = rows[("p5.48xlarge", 2)]["live"]
    assert p5x2["attainable"] is False
    assert any(r.startswith("us-east-1: needs a quota increase of 192 vCPUs (L-417A185B, 192 now): aws service-quotas "
                            "request-service-quota-increase --service-code ec2 --quota-code L-417A185B "
                            "--desired-value 384 --region us-east-1") for r in p5x2["reasons"])
    # the GCP row keeps the catalog and says so
    gcp = rows[("a2-highgpu-8g", 1)]["live"]
    assert gcp["price_source"] == "catalog" and gcp["attainable"] is None
    assert gcp["reasons"] == ["GCP has no live provider yet: catalog price, launch not checked"]
    # re-ranked: what launches now first, by live cost; then unknown; then blocked by quota
    order = [(r["estimate"]["setup"]["instance"], r["estimate"]["setup"]["nodes"]) for r in doc["rows"]]
    launch = [rows[k]["live"]["attainable"] for k in order]
    assert launch == sorted(launch, key=lambda a: {True: 0, None: 1, False: 2}[a])
    costs = [rows[k]["live"]["total_usd"] for k in order if rows[k]["live"]["attainable"]]
    assert costs == sorted(costs) and [r["rank"] for r in doc["rows"]] == [1, 2, 3, 4, 5]
    assert doc["rows"][0]["why"].startswith("cheapest that can launch now (live)")
    assert "2 nodes: needs a cluster placement group in one AZ with EFA" in rows[("p4d.24xlarge", 2)]["live"]["reasons"]
    assert doc["live"]["reason"].endswith("3 row(s) launch now, 1 not fully checked, 1 wait for a quota increase, "
                                          "0 excluded; 4 at live prices")


def test_far_below_quota_excludes_the_row_with_the_command(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, server.url, attempts=1)
    world({"us-east-1": 96}).install(monkeypatch)
    doc = live_json("--live", "--regions", "us-east-1")
    excluded = {x["instance"]: x["reason"] for x in doc["excluded"]}
    assert "p5.48xlarge" in excluded  # 96 free of 192 or 384 needed: x2 is far below, x1 is exactly half
    assert "2 node(s) cannot launch now: us-east-1: needs a quota increase of 288 vCPUs (L-417A185B, 96 now)" in \
        excluded["p5.48xlarge"]
    assert ("p5.48xlarge", 2) not in rows_by_setup(doc)
    assert rows_by_setup(doc)[("p5.48xlarge", 1)]["live"]["attainable"] is False


def test_data_gravity_moves_the_row_to_the_data(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, server.url, attempts=1)
    dataset = [2000 * GB, 2000 * GB]  # 4 TB in us-east-1
    world({"us-east-1": 384, "us-west-2": 384}, dataset).install(monkeypatch)
    doc = live_json("--live", "--regions", "us-east-1,us-west-2", "--data", "s3://ds-east/tokens/")
    assert doc["live"]["data"] == {"url": "s3://ds-east/tokens/", "region": "us-east-1", "bytes": 4000 * GB,
                                   "objects": 2}
    p4d = rows_by_setup(doc)[("p4d.24xlarge", 1)]["live"]
    assert p4d["region"] == "us-east-1" and p4d["transfer_gb"] is None  # cheaper in us-west-2 without the data
    # only us-west-2: every row pays to move the dataset once and its checkpoints, in money and time
    world({"us-west-2": 384}, dataset).install(monkeypatch)
    doc = live_json("--live", "--regions", "us-west-2", "--data", "s3://ds-east/tokens/", "--max-age", "0")
    row = rows_by_setup(doc)[("p4d.24xlarge", 1)]
    x, st = row["live"], row["estimate"]["storage"]
    t = aws_limits().transfer
    ckpt_gb = st["checkpoints_written"] * st["checkpoint_gb"]
    assert x["transfer_gb"] == pytest.approx(4000 + ckpt_gb)
    assert x["transfer_usd"] == pytest.approx((4000 + ckpt_gb) * t.inter_region_usd_per_gb)
    assert x["transfer_hours"] == pytest.approx(4000 * 8 / t.cross_region_gbps_per_node / 3600)
    hours = row["estimate"]["time"]["train_hours"]
    assert x["total_usd"] == pytest.approx(19.30 * (hours + x["transfer_hours"]) + x["transfer_usd"])
    assert any("data in another region" in r for r in x["reasons"])


def test_text_output_shows_the_live_lines(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, server.url, attempts=1)
    world({"us-east-1": 192}).install(monkeypatch)
    code, out, err = invoke(*PLAN, "--live", "--regions", "us-east-1")
    assert code == 0 and "Traceback" not in err
    assert "Live (aws, us-east-1): plan --live: account 123456789012" in out
    assert "launchable; $21.96/h live; expected $" in out and "p90 $" in out


# ---------------------------------------------------------------------------- the worst case

def test_worst_case_quantile_matches_a_simulation():
    rng = np.random.default_rng(7)

    def simulate(run_h: float, mtbf_h: float, interval_s: float, restart_s: float, n: int = 20000) -> float:
        """n runs, each interrupted at exponential gaps until run_h; an interruption loses the restart and a uniform
        share of a checkpoint interval. Vectorized in blocks (the third case draws ~14 million gaps)."""
        expected = run_h / mtbf_h
        gaps = int(expected + 10 * math.sqrt(expected) + 20)  # more than any run needs (10 sigma)
        lost = []
        for block in range(0, n, 1000):
            times = np.cumsum(rng.exponential(mtbf_h, (min(1000, n - block), gaps)), axis=1)
            assert (times[:, -1] >= run_h).all()  # every run drew gaps past its end
            k = (times < run_h).sum(axis=1)
            share = np.where(np.arange(gaps) < k[:, None], rng.random(times.shape), 0.0).sum(axis=1)
            lost.append(k * restart_s / 3600 + share * interval_s / 3600)
        return float(np.sort(np.concatenate(lost))[int(0.9 * n)])

    for run_h, mtbf_h, interval_s, restart_s in [(100, 12, 1800, 900), (40, 3, 900, 900), (1000, 1.5, 600, 900)]:
        exact = lost_hours_quantile(run_h, mtbf_h, interval_s, restart_s)
        # 20,000 runs agree with the closed form within 0.7% over seeds 7-14: 2% catches a 3% error
        assert exact == pytest.approx(simulate(run_h, mtbf_h, interval_s, restart_s), rel=0.02)
    assert lost_hours_quantile(10, 1e6, 600, 600) == 0.0  # on-demand, short: no interruption 90% of the time
    base = 10 * (1 + 1 / 600)
    assert worst_case_hours(10, 1, 600, 1e6, 600) == pytest.approx(base)
    assert math.isclose(worst_case_hours(10, 1, 600, 2.0, 900), base + lost_hours_quantile(base, 2.0, 600, 900))


def test_spot_worst_case_is_above_expected(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, server.url, creds=False)
    code, out, err = invoke(*PLAN, "--spot", "--live", "--json")
    assert code == 0, err
    for row in json.loads(out)["rows"]:
        x = row["live"]
        if x["total_usd"]:
            assert x["worst_case_usd"] > x["total_usd"] and x["worst_case_hours"] > row["estimate"]["cost"]["spot_hours"]


def test_rank_by_time_counts_a_spot_rows_interruptions():
    """A spot row is ranked by the hours its cost counts (interruptions included), not the on-demand hours."""
    from types import SimpleNamespace as NS

    from trainready.cloud.live import _hours_of

    row = NS(estimate=NS(cost=NS(spot_hours=12.0), time=NS(train_hours=10.0, compute_hours=9.5, overhead_fraction=0.05),
                         throughput=NS(tokens_per_s=1e5)), live=NS(transfer_hours=0.5))
    assert _hours_of(row, spot=True) == 12.5
    assert _hours_of(row, spot=False) == 10.5
    no_tokens = NS(estimate=NS(cost=NS(spot_hours=None), time=NS(train_hours=None, compute_hours=None,
                                                                 overhead_fraction=0.1),
                               throughput=NS(tokens_per_s=1e6)), live=None)
    assert _hours_of(no_tokens, spot=False) == pytest.approx(1e9 / 1e6 / 3600 * 1.1)  # per 1B tokens
