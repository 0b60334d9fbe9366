"""`trainready account` against moto's standalone server on 127.0.0.1 (and botocore's Stubber for what
moto lacks): every line's status and reason, the exit codes, the JSON schema, and the bad worlds
(no or expired credentials, AccessDenied everywhere, a throttled API, a region without the type, stale
and corrupt caches). No test leaves 127.0.0.1: `net` refuses and records any attempt, and each test
asserts there was none."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import jsonschema
import pytest
from cloud_stubs import (
    ACCOUNT,
    ENCODED,
    World,
    aws_env,
    capacity_blocks,
    decoded,
    denied_message,
    invoke,
    no_internet,
    placement_scores,
    quota,
    reservations,
    spot_history,
    usage,
)
from test_schemas import strict

from trainready.catalog.quotas import aws_limits
from trainready.cloud.cache import Cache

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "docs" / "schemas" / "account.schema.json").read_text())
P = ("L-417A185B", "Running On-Demand P instances")


@pytest.fixture(scope="module")
def server():
    """moto for this module alone (budgets made here stay here), warmed: its first DescribeInstanceTypes
    loads every type (~2 s)."""
    from s3server import MotoServer

    srv = MotoServer()
    ec2 = boto3.client("ec2", endpoint_url=srv.url, region_name="us-east-1", aws_access_key_id="x",
                       aws_secret_access_key="y")
    ec2.describe_instance_types(InstanceTypes=["p5.48xlarge"])
    yield srv
    srv.stop()


@pytest.fixture
def net(monkeypatch):
    with no_internet(monkeypatch) as tried:
        yield tried
    assert tried == [], f"a test tried to leave 127.0.0.1: {tried}"


@pytest.fixture
def env(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, server.url, attempts=1)  # moto's 500s for what it lacks: no retry wait
    return server


def run_json(*args: str, expect: int) -> dict:
    code, out, err = invoke("account", *args, "--json")
    assert "Traceback" not in err
    assert code == expect, err
    doc = json.loads(out)
    jsonschema.validate(doc, strict(SCHEMA))
    return doc


def stub_region(world: World, region: str, itype: str, *, limit: float, used: float | None, spot=None, scores=None,
                blocks=None, cr=None, purchase: str = "on-demand") -> World:
    code = aws_limits().quota_for(itype, purchase)
    klass = "P/OnDemand" if purchase == "on-demand" else "P/Spot"
    world.respond("service-quotas", region, "get_service_quota", quota(code.code, code.name, limit, klass, region))
    world.respond("cloudwatch", region, "get_metric_statistics", usage(used))
    world.respond("ec2", region, "describe_spot_price_history", spot or {"SpotPriceHistory": []})
    if scores is not None:
        world.respond("ec2", region, "get_spot_placement_scores", scores)
    world.respond("ec2", region, "describe_capacity_block_offerings", blocks or {"CapacityBlockOfferings": []})
    world.respond("ec2", region, "describe_capacity_reservations", cr or {"CapacityReservations": []})
    return world


# ---------------------------------------------------------------------------- the catalog's quota data

def test_quota_codes_by_family_and_purchase():
    limits = aws_limits()
    got = {(t, p): limits.quota_for(t, p).code for t in ("p5en.48xlarge", "p4d.24xlarge", "p6-b200.48xlarge",
                                                          "g5.12xlarge", "g6e.48xlarge", "trn1.32xlarge",
                                                          "inf2.xlarge", "m7i.large") for p in ("on-demand", "spot")}
    assert got[("p5en.48xlarge", "on-demand")] == got[("p4d.24xlarge", "on-demand")] == "L-417A185B"
    assert got[("p4d.24xlarge", "spot")] == "L-7212CCBC" and got[("p5en.48xlarge", "spot")] == "L-C4BD4855"
    assert got[("g5.12xlarge", "on-demand")] == got[("g6e.48xlarge", "on-demand")] == "L-DB2E81BA"
    assert got[("g5.12xlarge", "spot")] == "L-3819A6DF"
    assert got[("trn1.32xlarge", "on-demand")] == "L-2C3B7624" and got[("inf2.xlarge", "spot")] == "L-B5D1601B"
    assert got[("m7i.large", "on-demand")] == "L-1216C47A"
    assert all(q.source for q in limits.quota)
    cb = limits.capacity_blocks
    assert [cb.duration_hours(h) for h in (1, 24, 30, 14 * 24, 15 * 24, 183 * 24)] == [24, 24, 48, 336, 504, None]
    assert [cb.instance_count(n) for n in (1, 3, 8, 65)] == [1, 4, 8, None]


# ---------------------------------------------------------------------------- moto's world, stubs for its gaps

def test_two_regions_one_without_the_type(env, monkeypatch):
    world = World().respond("service-quotas", "us-east-1", "get_service_quota",
                            quota(*P, 768, "P/OnDemand", "us-east-1"))
    world.respond("cloudwatch", "us-east-1", "get_metric_statistics", usage(None))
    world.respond("service-quotas", "eu-west-1", "get_service_quota", quota(*P, 768, "P/OnDemand", "eu-west-1"))
    world.install(monkeypatch)
    doc = run_json("--instance", "p5.48xlarge", "--nodes", "2", "--region", "us-east-1,eu-west-1", expect=0)
    assert doc["identity"] == {"account": ACCOUNT, "arn": f"arn:aws:sts::{ACCOUNT}:user/moto", "status": "ok",
                               "reason": doc["identity"]["reason"]}
    assert doc["vcpus_needed"] == 384 and doc["vcpus_per_instance"] == 192
    east, west = doc["regions"]
    assert east["offerings"]["azs"] == ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e",
                                        "us-east-1f"]  # moto's offering data
    assert east["offerings"]["efa"] is True and east["offerings"]["network_cards"] == 32
    assert "cluster placement group in one AZ with EFA" in east["offerings"]["reason"]
    run = next(p for p in east["permissions"] if p["action"] == "ec2:RunInstances")
    assert run["status"] == "ok" and "dry run" in run["reason"]
    q = east["quotas"][0]
    assert (q["code"], q["limit_vcpus"], q["used_vcpus"], q["needed_vcpus"], q["status"]) == \
        ("L-417A185B", 768, 0, 384, "ok")
    assert "nothing of this class running" in q["reason"]
    # moto has no placement scores, Capacity Blocks or reservations: unknown, and the rest went on
    assert east["capacity"]["status"] == "unknown" and "AWS_ENDPOINT_URL" in east["capacity"]["reason"]
    assert west["offerings"]["status"] == "fail" and west["status"] == "fail"
    assert "not offered in eu-west-1" in west["offerings"]["reason"]
    assert doc["usable_regions"] == ["us-east-1"]
    assert doc["budget"]["present"] is False and doc["budget"]["status"] == "warn"
    assert doc["budget"]["command"].startswith(f"aws budgets create-budget --account-id {ACCOUNT} --budget ")


def test_only_a_region_without_the_type_is_exit_1(env, monkeypatch):
    World().respond("service-quotas", "eu-west-1", "get_service_quota",
                    quota(*P, 768, "P/OnDemand", "eu-west-1")).install(monkeypatch)
    code, out, err = invoke("account", "--instance", "p5.48xlarge", "--region", "eu-west-1")
    assert code == 1 and "Traceback" not in err
    assert "p5.48xlarge is not offered in: eu-west-1" in out
    assert "cannot launch now in any region asked" in out


def test_quota_short_says_how_much_and_the_command(env, monkeypatch):
    spot = spot_history("p5.48xlarge", {"us-east-1a": [(150, "31.20"), (30, "33.10")],
                                        "us-east-1c": [(170, "29.90"), (48, "35.00"), (2, "28.40")]})
    world = stub_region(World(), "us-east-1", "p5.48xlarge", limit=384, used=96, spot=spot,
                        scores=placement_scores([("us-east-1", "use1-az4", 3), ("us-east-1", "use1-az6", 2)]),
                        blocks=capacity_blocks("p5.48xlarge", [("us-east-1a", 2, 48, 6, "5304.00"),
                                                               ("us-east-1c", 2, 48, 3, "4891.20")]),
                        cr=reservations("p5.48xlarge", [("us-east-1a", 2, 1)]), purchase="spot")
    world.install(monkeypatch)
    doc = run_json("--instance", "p5.48xlarge", "--nodes", "2", "--hours", "30", "--spot", "--region", "us-east-1",
                   expect=1)
    r = doc["regions"][0]
    q = r["quotas"][0]
    assert q["code"] == "L-C4BD4855" and q["purchase"] == "spot"  # spot: the P5 spot quota
    assert (q["limit_vcpus"], q["used_vcpus"], q["headroom_vcpus"], q["needed_vcpus"]) == (384, 96, 288, 384)
    assert q["status"] == "fail" and q["request_vcpus"] == 480 and "short by 96" in q["reason"]
    assert q["request_command"] == ("aws service-quotas request-service-quota-increase --service-code ec2 "
                                    "--quota-code L-C4BD4855 --desired-value 480 --region us-east-1")
    s = r["spot"]
    assert s["by_az"] == {"us-east-1a": 33.10, "us-east-1c": 28.40} and s["price_now_usd_per_hour"] == 28.40
    assert (s["min"], s["max"], s["records"]) == (28.40, 35.00, 5)
    # time-weighted over 7 days (168 h, 1c's first record clipped to it): 1a 31.20 for 120 h, 33.10 for 30 h;
    # 1c 29.90 for 120 h, 35.00 for 46 h, 28.40 for 2 h. Of 318 h, half (159 h) is reached within 31.20's hours
    # (28.40 and 29.90 hold for 122 h)
    assert s["median"] == 31.20
    assert s["placement_score"] == 3 and s["status"] == "warn" and "likely to wait or fail" in s["reason"]
    cheapest = r["capacity_blocks"][0]
    assert cheapest["upfront_fee_usd"] == 4891.20 and cheapest["availability_zone"] == "us-east-1c"
    assert cheapest["usd_per_instance_hour"] == pytest.approx(4891.20 / 2 / 48)
    asked = dict(world.calls("ec2", "us-east-1"))["DescribeCapacityBlockOfferings"]
    assert (asked["InstanceCount"], asked["CapacityDurationHours"]) == (2, 48)  # 30 h: bought by the day
    assert doc["regions"][0]["capacity_reservations"][0]["available"] == 1
    scores = dict(world.calls("ec2", "us-east-1"))["GetSpotPlacementScores"]
    assert scores["TargetCapacity"] == 2 and scores["SingleAvailabilityZone"] is True
    code, out, _ = invoke("account", "--instance", "p5.48xlarge", "--nodes", "2", "--spot", "--region", "us-east-1")
    assert "--quota-code L-C4BD4855 --desired-value 480 --region us-east-1" in re.sub(r" \\\n\s+", " ", out)


def test_request_quota_files_it_only_when_asked(env, monkeypatch):
    world = stub_region(World(), "us-east-1", "p4d.24xlarge", limit=0, used=None)
    world.respond("service-quotas", "us-east-1", "request_service_quota_increase", {"RequestedQuota": {
        "Id": "d2f8b4c1e7a94b3c8f6e5d4c3b2a1f0eEXAMPLE", "ServiceCode": "ec2", "QuotaCode": "L-417A185B",
        "DesiredValue": 192.0, "Status": "PENDING", "Created": time.time(),
        "Requester": f"arn:aws:iam::{ACCOUNT}:user/x",
        "QuotaArn": f"arn:aws:servicequotas:us-east-1:{ACCOUNT}:ec2/L-417A185B", "GlobalQuota": False,
        "Unit": "None"}})
    world.install(monkeypatch)
    doc = run_json("--instance", "p4d.24xlarge", "--nodes", "2", "--region", "us-east-1", expect=1)
    assert doc["quota_requests"] == [] and doc["regions"][0]["quotas"][0]["request_vcpus"] == 192
    assert "quota is 0 vCPUs" in doc["regions"][0]["quotas"][0]["reason"]
    world2 = stub_region(World(), "us-east-1", "p4d.24xlarge", limit=0, used=None)
    world2.stubs[("service-quotas", "us-east-1")] += world.stubs[("service-quotas", "us-east-1")][1:]
    world2.install(monkeypatch)
    doc = run_json("--instance", "p4d.24xlarge", "--nodes", "2", "--region", "us-east-1", "--request-quota",
                   "--max-age", "0", expect=1)
    (req,) = doc["quota_requests"]
    assert (req["code"], req["desired_vcpus"], req["state"], req["status"]) == ("L-417A185B", 192, "PENDING", "ok")
    sent = dict(world2.calls("service-quotas", "us-east-1"))["RequestServiceQuotaIncrease"]
    assert sent == {"ServiceCode": "ec2", "QuotaCode": "L-417A185B", "DesiredValue": 192.0}


# ---------------------------------------------------------------------------- permissions

def test_run_instances_denied_is_decoded_and_blocks(env, monkeypatch):
    world = stub_region(World(), "us-east-1", "p4d.24xlarge", limit=384, used=None)
    world.error("ec2", "us-east-1", "run_instances", "UnauthorizedOperation", denied_message(), 403)
    world.respond("sts", "us-east-1", "decode_authorization_message", decoded("us-east-1"))
    world.install(monkeypatch)
    doc = run_json("--instance", "p4d.24xlarge", "--region", "us-east-1", expect=1)
    run = next(p for p in doc["regions"][0]["permissions"] if p["action"] == "ec2:RunInstances")
    assert run["status"] == "fail"
    assert run["reason"] == (f"denied (UnauthorizedOperation): ec2:RunInstances on arn:aws:ec2:us-east-1:{ACCOUNT}:"
                             f"instance/* : denied by an explicit deny").replace("* :", "*:")
    assert dict(world.calls("sts", "us-east-1"))["DecodeAuthorizationMessage"] == {"EncodedMessage": ENCODED}


def test_access_denied_everywhere_leaves_unknown_lines_naming_the_permission(env, monkeypatch):
    world = World()
    for method in ("describe_instance_types", "describe_instance_type_offerings", "describe_spot_price_history",
                   "get_spot_placement_scores", "describe_capacity_block_offerings", "describe_capacity_reservations"):
        world.error("ec2", "us-east-1", method, "UnauthorizedOperation", "You are not authorized to perform this "
                                                                         "operation.", 403)
    world.error("service-quotas", "us-east-1", "get_service_quota", "AccessDeniedException", "no", 400)
    world.error("budgets", "us-east-1", "describe_budgets", "AccessDeniedException", "no", 400)
    world.install(monkeypatch)
    doc = run_json("--instance", "p5.48xlarge", "--region", "us-east-1", expect=0)
    r = doc["regions"][0]
    assert r["offerings"]["status"] == "unknown"
    assert "needs ec2:DescribeInstanceTypeOfferings" in r["offerings"]["reason"]
    assert r["quotas"][0]["status"] == "unknown" and "needs servicequotas:GetServiceQuota" in r["quotas"][0]["reason"]
    assert "needs ec2:DescribeSpotPriceHistory" in r["spot"]["reason"]
    assert "needs ec2:GetSpotPlacementScores" in r["spot"]["reason"]
    assert "needs ec2:DescribeCapacityReservations" in r["capacity"]["reason"]
    denied = {p["action"] for p in r["permissions"] if p["status"] == "warn"}
    assert {"ec2:DescribeInstanceTypeOfferings", "servicequotas:GetServiceQuota"} <= denied
    assert doc["budget"]["status"] == "unknown" and "budgets:ViewBudget" in doc["budget"]["reason"]
    assert doc["status"] == "warn"  # nothing known blocks (exit 0), but denied reads are not "ok"
    code, out, err = invoke("account", "--instance", "p5.48xlarge", "--region", "us-east-1")
    assert code == 0 and "Traceback" not in out + err


class _Throttle(BaseHTTPRequestHandler):
    """An EC2 endpoint that always says RequestLimitExceeded (EC2's throttling error), counting requests."""

    seen: list[str] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        action = next((p.split("=", 1)[1] for p in body.split("&") if p.startswith("Action=")), "?")
        _Throttle.seen.append(action)
        payload = (b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>RequestLimitExceeded</Code>'
                   b"<Message>Request limit exceeded.</Message></Error></Errors>"
                   b"<RequestID>d4904fd9-82c2-4ea5-adfe-a9cc3EXAMPLE</RequestID></Response>")
        self.send_response(503)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_throttled_api_is_retried_by_botocore_then_unknown(env, monkeypatch, tmp_path):
    from botocore.retries import standard

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Throttle)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Throttle.seen = []
    try:
        aws_env(monkeypatch, tmp_path, env.url, attempts=3)
        monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", f"http://127.0.0.1:{httpd.server_port}")  # botocore's own variable
        monkeypatch.setattr(standard.ExponentialBackoff, "delay_amount", lambda self, context: 0.0)  # no waiting
        World().respond("service-quotas", "us-east-1", "get_service_quota",
                        quota(*P, 384, "P/OnDemand", "us-east-1")).install(monkeypatch)
        doc = run_json("--instance", "p4d.24xlarge", "--region", "us-east-1", expect=0)
    finally:
        httpd.shutdown()
    r = doc["regions"][0]
    assert r["offerings"]["status"] == "unknown"
    assert "throttled (RequestLimitExceeded) after 3 attempts (botocore's retries)" in r["offerings"]["reason"]
    counts = {a: _Throttle.seen.count(a) for a in set(_Throttle.seen)}
    assert counts and set(counts.values()) <= {3}, counts  # standard mode: 3 attempts per call, none of ours
    assert {"DescribeInstanceTypeOfferings", "DescribeSpotPriceHistory"} <= set(counts)


# ---------------------------------------------------------------------------- credentials and usage errors

def test_no_credentials_is_one_line_and_exit_2(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, server.url, creds=False)
    code, out, err = invoke("account", "--instance", "p4d.24xlarge")
    assert code == 2 and out == ""
    assert err.startswith("error: no AWS credentials found: set AWS_PROFILE") and err.count("\n") == 1
    code, out, err = invoke("account", "--instance", "p4d.24xlarge", "--json")
    assert code == 2 and json.loads(out)["error"]["exit_code"] == 2


def test_no_network_is_one_line_and_exit_2(server, monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, "http://127.0.0.1:9", attempts=1)  # nothing listens on port 9
    code, out, err = invoke("account", "--instance", "p4d.24xlarge")
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1
    assert "cannot ask AWS who you are (sts:GetCallerIdentity): cannot reach AWS" in err


def test_expired_credentials(env, monkeypatch):
    World().error("sts", "us-east-1", "get_caller_identity", "ExpiredToken",
                  "The security token included in the request is expired", 403).install(monkeypatch)
    code, out, err = invoke("account", "--instance", "p4d.24xlarge")
    assert code == 2 and "Traceback" not in err
    assert "AWS refused the credentials: credentials refused (ExpiredToken)" in err


@pytest.mark.parametrize("args, message", [
    (["--instance", "p4d.24xlarge", "--region", "us-est-1"], "unknown region 'us-est-1'. Did you mean: "),
    (["--instance", "p5.48xlarg"], "unknown instance type 'p5.48xlarg'. Did you mean: p5.48xlarge"),
    (["--instance", "a2-highgpu-8g"], "a2-highgpu-8g is a GCP instance type: `account` checks AWS accounts only"),
    (["--instance", "p4d.24xlarge", "--create-budget", "100"], "--create-budget USD and --email ADDR go together"),
    (["--instance", "p4d.24xlarge", "--create-budget", "100", "--email", "nobody"], "--email 'nobody' is not an"),
    (["--instance", "p4d.24xlarge", "--max-age", "soon"], "--max-age 'soon' is not a duration"),
    (["--instance", "p4d.24xlarge", "--archive", "gs://b/x"], "--archive 'gs://b/x': give an s3://bucket/prefix URL"),
    (["--nodes", "2"], "give --instance TYPE (and --nodes N), or --job job.toml"),
])
def test_bad_input_is_exit_2_with_the_nearest_names(env, args, message):
    code, out, err = invoke("account", *args)
    assert code == 2 and "Traceback" not in err
    assert err.startswith("error: ") and message in err, err
    if "us-est-1" in args:
        assert "us-east-1" in err.split("Did you mean: ")[1].split("?")[0]


# ---------------------------------------------------------------------------- budget and archive

def test_budget_created_only_when_asked_with_three_alerts(env, monkeypatch):
    stub_region(World(), "us-east-1", "p4d.24xlarge", limit=384, used=None).install(monkeypatch)
    doc = run_json("--instance", "p4d.24xlarge", "--region", "us-east-1", "--create-budget", "500", "--email",
                   "ops@example.com", expect=0)
    b = doc["budget"]
    assert (b["present"], b["created"], b["name"], b["limit_usd"], b["status"]) == (True, True, "trainready", 500, "ok")
    budgets = boto3.client("budgets", endpoint_url=env.url, region_name="us-east-1")
    alerts = budgets.describe_notifications_for_budget(AccountId=ACCOUNT, BudgetName="trainready")["Notifications"]
    assert sorted(n["Threshold"] for n in alerts) == [50, 80, 100]
    assert {n["NotificationType"] for n in alerts} == {"ACTUAL"}
    budgets.delete_budget(AccountId=ACCOUNT, BudgetName="trainready")


def test_archive_bucket_checked(env, monkeypatch):
    s3 = boto3.client("s3", endpoint_url=env.url, region_name="eu-west-1")
    s3.create_bucket(Bucket="ckpt-eu", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    s3.put_object(Bucket="ckpt-eu", Key="run-1/writer.json", Body=b"{}")
    stub_region(World(), "us-east-1", "p4d.24xlarge", limit=384, used=None).install(monkeypatch)
    doc = run_json("--instance", "p4d.24xlarge", "--region", "us-east-1", "--archive", "s3://ckpt-eu/run-1", expect=0)
    lines = {p["action"]: p for p in doc["permissions"]}
    assert lines["s3:GetBucketLocation"]["reason"] == "bucket ckpt-eu is in eu-west-1"
    assert lines["s3:ListBucket"]["status"] == "ok" and "1 object(s)" in lines["s3:ListBucket"]["reason"]
    assert lines["s3:PutObject"]["status"] == "unknown"
    stub_region(World(), "us-east-1", "p4d.24xlarge", limit=384, used=None).install(monkeypatch)
    doc = run_json("--instance", "p4d.24xlarge", "--region", "us-east-1", "--archive", "s3://no-such-bucket-x/r",
                   expect=1)
    assert "bucket no-such-bucket-x does not exist" in doc["reason"]


# ---------------------------------------------------------------------------- the cache

def test_second_run_comes_from_the_cache_and_stale_answers_are_asked_again(env, monkeypatch):
    world = stub_region(World(), "us-east-1", "p4d.24xlarge", limit=384, used=None)
    world.install(monkeypatch)
    first = run_json("--instance", "p4d.24xlarge", "--region", "us-east-1", expect=0)
    assert first["cache"]["hits"] == 0 and first["cache"]["misses"] > 0
    World().install(monkeypatch)  # nothing stubbed now: an answer not cached would be moto's
    second = run_json("--instance", "p4d.24xlarge", "--region", "us-east-1", expect=0)
    assert second["cache"]["hits"] >= first["cache"]["misses"] - 1  # moto's 500 for placement scores: never kept
    assert second["regions"][0]["quotas"] == first["regions"][0]["quotas"]  # moto has no ec2 quotas: cached
    cache_dir = Path(os.environ["TRAINREADY_CACHE_DIR"]) / "aws"
    for f in cache_dir.glob("*.json"):  # two hours old: stale for --max-age 1h
        rec = json.loads(f.read_text())
        rec["stored_unix"] -= 7200
        f.write_text(json.dumps(rec))
    world = stub_region(World(), "us-east-1", "p4d.24xlarge", limit=96, used=None)
    world.install(monkeypatch)
    third = run_json("--instance", "p4d.24xlarge", "--nodes", "1", "--region", "us-east-1", expect=0)
    assert third["cache"]["hits"] == 0 and third["cache"]["notes"] == []
    assert third["regions"][0]["quotas"][0]["limit_vcpus"] == 96


@pytest.mark.parametrize("damage, note", [
    (lambda p: p.write_bytes(b"\x00garbage{"), "not JSON"),
    (lambda p: p.write_text(json.dumps({"version": 1})), "not a cache record"),
    (lambda p: p.write_text(json.dumps({"version": 1, "key": "other", "stored_unix": time.time(), "value": {}})),
     "holds the answer to another question"),
    (lambda p: _edit(p, stored_unix=time.time() + 86400), "timestamp is in the future"),
    (lambda p: _edit(p, stored_unix="yesterday"), "timestamp is not a number"),
    (lambda p: _edit(p, value={"azs": "us-east-1a"}), "field azs"),
    (lambda p: _edit(p, value={"azs": [], "exec": "rm -rf /"}), "field exec"),
    (lambda p: p.write_bytes(b" " * (5 * 2**20)), "more than the 4 MiB"),
    (lambda p: (p.unlink(), p.symlink_to("/etc/passwd")), "a symlink"),
])
def test_hostile_cache_file_is_ignored_with_a_note(tmp_path, damage, note):
    from trainready.cloud.aws import AzList

    cache = Cache(tmp_path)
    key = json.dumps(["123", "us-east-1", "offerings", "p4d.24xlarge"])
    cache.put(key, AzList(azs=["us-east-1a"]))
    assert cache.get(key, AzList)[0].azs == ["us-east-1a"]
    damage(cache.path(key))
    assert cache.get(key, AzList) is None
    assert len(cache.notes) == 1 and note in cache.notes[0], cache.notes


def _edit(path: Path, **fields) -> None:
    rec = json.loads(path.read_text())
    rec.update(fields)
    path.write_text(json.dumps(rec))


def test_corrupt_cache_in_a_real_run_is_a_note_not_a_traceback(env, monkeypatch):
    stub_region(World(), "us-east-1", "p4d.24xlarge", limit=384, used=None).install(monkeypatch)
    run_json("--instance", "p4d.24xlarge", "--region", "us-east-1", expect=0)
    for f in (Path(os.environ["TRAINREADY_CACHE_DIR"]) / "aws").glob("*.json"):
        f.write_text("{not json")
    stub_region(World(), "us-east-1", "p4d.24xlarge", limit=384, used=None).install(monkeypatch)
    code, out, err = invoke("account", "--instance", "p4d.24xlarge", "--region", "us-east-1")
    assert code == 0 and "Traceback" not in err
    assert "ignored cache file" in out and "not JSON" in out


def test_regions_all_are_the_accounts_enabled_regions(env, monkeypatch):
    world = World().respond("ec2", "us-east-1", "describe_regions", {"Regions": [
        {"Endpoint": "ec2.us-east-1.amazonaws.com", "RegionName": "us-east-1", "OptInStatus": "opt-in-not-required"},
        {"Endpoint": "ec2.us-west-2.amazonaws.com", "RegionName": "us-west-2", "OptInStatus": "opt-in-not-required"}]})
    for region in ("us-east-1", "us-west-2"):
        world.respond("service-quotas", region, "get_service_quota", quota(*P, 384, "P/OnDemand", region))
    world.install(monkeypatch)
    doc = run_json("--instance", "p4d.24xlarge", "--regions", "all", expect=0)
    assert [r["region"] for r in doc["regions"]] == ["us-east-1", "us-west-2"]


def test_region_spelled_as_plan_accepts_it():
    """`plan --region us_east_1` works (case and separators ignored): account takes the same spellings."""
    from trainready.catalog import load_catalog
    from trainready.cli.account_cmd import parse_regions

    catalog = load_catalog()
    assert parse_regions("US_East_1, us-west-2,us-east-1", catalog, None) == ["us-east-1", "us-west-2"]
    assert parse_regions("ALL", catalog, None) is None  # was "unknown region 'ALL'" while US-EAST-1 passed


def test_nothing_checked_is_not_a_yes(env, monkeypatch):
    """issue 26: with STS answering and every other call unreachable, account said 'can launch now' and exit 0.
    Unknown is not yes: exit 1, saying what could not be checked."""
    for service in ("EC2", "SERVICE_QUOTAS", "BUDGETS", "S3"):
        monkeypatch.setenv(f"AWS_ENDPOINT_URL_{service}", "http://127.0.0.1:9")  # nothing listens: refused at once
    code, out, err = invoke("account", "--instance", "p4d.24xlarge", "--region", "us-east-1", "--json")
    assert code == 1 and "Traceback" not in err, err
    doc = json.loads(out)
    assert doc["status"] == "unknown" and doc["usable_regions"] == []
    assert doc["reason"].startswith("whether 1 x p4d.24xlarge can launch could not be checked in any region asked: "
                                    "us-east-1: "), doc["reason"]
    code, out, err = invoke("account", "--instance", "p4d.24xlarge", "--region", "us-east-1")
    assert code == 1 and "could not be checked" in out + err


def test_an_endpoint_password_never_reaches_any_output(env, monkeypatch, tmp_path):
    """issue 26: a user:password in AWS_ENDPOINT_URL reached account's and plan --live's lines, --json and
    plan --html (botocore quotes the endpoint in its errors). Every one of them goes through the redactor."""
    for service in ("EC2", "SERVICE_QUOTAS", "BUDGETS", "S3", "PRICING", "SSM", "CLOUDWATCH"):
        monkeypatch.setenv(f"AWS_ENDPOINT_URL_{service}", "http://admin:pwSECRET789@127.0.0.1:9")  # refused at once
    page = tmp_path / "plan.html"
    runs = [invoke("account", "--instance", "p4d.24xlarge", "--region", "us-east-1", *extra) for extra in ((), ("--json",))]
    plan = ("plan", "--model", "llama-2-7b", "--method", "lora", "--tokens", "1e8", "--instances", "p4d.24xlarge", "--live")
    runs += [invoke(*plan), invoke(*plan, "--json"), invoke(*plan, "--html", str(page))]
    leaks = [i for i, (_, out, err) in enumerate(runs) if "pwSECRET789" in out + err]
    assert not leaks, leaks
    said = "".join(out + err for _, out, err in runs) + page.read_text()
    assert "127.0.0.1:9" in said  # the endpoint is named, so its password would have been there
    assert "pwSECRET789" not in said and "Traceback" not in said
    # a password long enough to cross the 300-character cut of a reason: redacted before the cut, not after
    long = "eyJhbGciOiJIUzI1NiJ9" + "Q" * 300
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", f"http://svc:{long}@127.0.0.1:9/")
    _, out, err = invoke("account", "--instance", "p4d.24xlarge", "--region", "us-east-1", "--json")
    assert "eyJhbGciOiJIUzI1NiJ9" not in out + err and "QQQQQQQQ" not in out + err


class _Trickle(BaseHTTPRequestHandler):
    """An endpoint that answers a byte every 0.5 s and never finishes: botocore's read timeout is per read, and
    it retries, so without a deadline a command would wait for ever."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        try:
            for _ in range(600):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.5)
        except OSError:
            pass

    def log_message(self, *args):
        pass


def test_a_trickling_endpoint_ends_at_the_deadline(env, monkeypatch):
    """issue 26: every live command has a total deadline (--deadline, TRAINREADY_LIVE_DEADLINE_S), after which each
    unanswered line is unknown and the command returns."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        for service in ("EC2", "SERVICE_QUOTAS", "BUDGETS", "SSM", "PRICING", "CLOUDWATCH"):
            monkeypatch.setenv(f"AWS_ENDPOINT_URL_{service}", f"http://127.0.0.1:{httpd.server_port}")
        started = time.monotonic()
        code, out, err = invoke("account", "--instance", "p4d.24xlarge", "--region", "us-east-1", "--deadline", "3",
                                "--json")
        took = time.monotonic() - started
        started = time.monotonic()
        plan = invoke("plan", "--model", "llama-2-7b", "--method", "lora", "--tokens", "1e8", "--instances",
                      "p4d.24xlarge", "--live-deadline", "3", "--json")
        plan_took = time.monotonic() - started
    finally:
        httpd.shutdown()
    assert "Traceback" not in err and took < 15, (took, err[-500:])
    # plan --live-deadline bounds plan --live the same way: its rows come back with their live lines unknown
    assert plan[0] == 0 and "Traceback" not in plan[2] and plan_took < 20, (plan_took, plan[2][-500:])
    doc = json.loads(plan[1])
    assert doc["live"]["live"] is True and "launch now" in doc["live"]["reason"]
    assert doc["rows"] and all("3 s deadline" in json.dumps(row["live"]) for row in doc["rows"]), doc["rows"][0]["live"]
    doc = json.loads(out)
    r = doc["regions"][0]
    assert r["offerings"]["status"] == "unknown" and "3 s deadline" in r["offerings"]["reason"]
    assert code == 1 and doc["status"] == "unknown"  # nothing about launching was answered
    monkeypatch.setenv("TRAINREADY_LIVE_DEADLINE_S", "soon")
    code, out, err = invoke("account", "--instance", "p4d.24xlarge", "--region", "us-east-1")
    assert code == 2 and "TRAINREADY_LIVE_DEADLINE_S='soon'" in err


def test_a_hanging_credential_process_ends_at_the_deadline(env, monkeypatch, tmp_path):
    """The deadline covers finding the credentials too: a credential_process (or an instance role's metadata
    service) that hangs held `account` and `plan --live` for as long as it did (41 s for a 40 s sleep)."""
    config = tmp_path / "aws-config"
    config.write_text("[default]\ncredential_process = /bin/sleep 20\nregion = us-east-1\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    started = time.monotonic()
    code, out, err = invoke("account", "--instance", "p4d.24xlarge", "--region", "us-east-1", "--deadline", "2")
    assert time.monotonic() - started < 10 and code == 2, (code, err[-400:])
    assert "AWS credentials: no answer within the 2 s deadline" in err
