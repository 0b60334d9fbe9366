"""Hostile-user findings against `trainready account`, `plan --live` (issue 14) and `run --emit k8s|jobset|pcluster`
(issue 17), one regression test each. Nothing here leaves the machine: the AWS endpoint is 127.0.0.1:9 (nothing
listens) or a fake provider object, and `net` refuses anything else."""

from __future__ import annotations

import json
import math
import os

import pytest
from cloud_stubs import aws_env, invoke, no_internet

from trainready.catalog import load_catalog
from trainready.cloud.account import Ask, region_report
from trainready.cloud.aws import Blocks, CallFailed, Reservations, TypeFact
from trainready.cloud.cache import Cache

DEAD = "http://127.0.0.1:9"  # the discard port: connection refused at once


@pytest.fixture
def net(monkeypatch):
    with no_internet(monkeypatch) as tried:
        yield tried
    assert tried == [], f"a test tried to leave 127.0.0.1: {tried}"


@pytest.fixture
def dead_env(monkeypatch, tmp_path, net):
    aws_env(monkeypatch, tmp_path, DEAD, attempts=1)


def test_bad_aws_max_attempts_is_exit_2_for_account_and_catalog_prices_for_plan_live(dead_env, monkeypatch):
    """AWS_MAX_ATTEMPTS=abc made botocore's int() fail deep inside client creation: exit 3 with a ValueError."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "abc")
    code, out, err = invoke("account", "--instance", "p5.48xlarge")
    assert code == 2 and "AWS_MAX_ATTEMPTS" in err and "internal error" not in err, err
    code, out, err = invoke("plan", "--model", "llama-2-7b", "--tokens", "1e9", "--clouds", "aws", "--live", "--json")
    assert code == 0, err
    live = json.loads(out)["live"]
    assert live["live"] is False and "AWS_MAX_ATTEMPTS" in live["reason"]


def test_unknown_default_region_is_exit_2_like_an_unknown_region_option(dead_env, monkeypatch):
    """AWS_DEFAULT_REGION=Mars-1 went unchecked: every region line came back unknown and the verdict was exit 0."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "Mars-1")
    code, out, err = invoke("account", "--instance", "p4d.24xlarge")
    assert code == 2 and "unknown region 'Mars-1'" in err and "AWS_DEFAULT_REGION" in err, err
    assert "\n" not in err.strip()
    monkeypatch.setenv("AWS_DEFAULT_REGION", "US-WEST-2")  # a valid name in capitals still goes through
    code, out, err = invoke("account", "--instance", "p4d.24xlarge")
    assert "unknown region" not in err and "cannot ask AWS who you are" in err


class _Provider:
    """Offerings and instance types unanswered (a denied or failing call), the dry run allowed."""

    def __init__(self):
        self.calls: dict = {}
        self.dry_runs = 0

    def _fail(self, *a, **k):
        raise CallFailed("ec2:DescribeInstanceTypeOfferings", "error", "the service failed (HTTP 500)")

    instance_type = offerings = quota = spot_history = reservations = _fail

    def ami(self, region, arch):
        from trainready.cloud.aws import Text

        return Text(value="ami-0123456789abcdef0"), None

    def dry_run(self, region, itype, nodes, spot, ami):
        self.dry_runs += 1
        return "allowed", ""

    def capacity_blocks(self, *a):
        return Blocks(blocks=[]), None


def test_offerings_unknown_is_not_reported_as_not_offered():
    """An offerings call that failed made RunInstances 'not tried: the type is not offered here' and the capacity
    line 'the type is not offered here', though nothing said so."""
    p = _Provider()
    ask = Ask(instance=load_catalog().instance("p5.48xlarge"), nodes=2, spot=False, hours=24, regions=("us-east-1",))
    rep = region_report(p, "us-east-1", ask)  # type: ignore[arg-type]
    assert rep.offerings.status == "unknown"
    run = next(x for x in rep.permissions if x.action == "ec2:RunInstances")
    assert p.dry_runs == 1 and run.status == "ok", run
    assert "not offered" not in rep.capacity.reason and "not offered" not in run.reason


BLOCK = {"start": "2026-12-02T11:30:00Z", "end": "2026-12-03T11:30:00Z", "instance_count": 2,
         "upfront_fee_usd": 2000.0, "availability_zone": "us-east-1a", "duration_hours": 24,
         "usd_per_instance_hour": 41.7}


@pytest.mark.parametrize("bad", [{"upfront_fee_usd": math.inf}, {"usd_per_instance_hour": math.nan},
                                 {"instance_count": "2"}, {"extra": 1}])
def test_cached_capacity_blocks_are_as_strict_as_every_other_cached_answer(tmp_path, bad):
    """The cache promises 'every field, no extra ones, finite numbers', but the nested CapacityBlock took 1e999
    (account --json then wrote Infinity, which is not JSON), strings for numbers and extra fields."""
    cache = Cache(tmp_path, max_age_s=3600)
    cache.put("k", Blocks.model_validate({"blocks": [BLOCK]}))
    path = cache.path("k")
    doc = json.loads(path.read_text())
    doc["value"]["blocks"][0].update(bad)
    path.write_text(json.dumps(doc))  # json writes inf as Infinity; the reader refuses that constant too
    assert cache.get("k", Blocks) is None
    assert len(cache.notes) == 1 and "ignored cache file" in cache.notes[0]
    res = {"id": "cr-0123456789abcdef0", "availability_zone": "us-east-1a", "total": 2, "available": 1,
           "state": "active", "end": None}
    assert Reservations.model_validate({"items": [res]})
    with pytest.raises(ValueError):
        Reservations.model_validate({"items": [{**res, "total": "2"}]})
    assert TypeFact(exists=True)  # the _Fact models were strict already


def test_plan_live_offline_keeps_non_aws_rows_offline_and_says_why_once(dead_env):
    """Without credentials every row said 'not checked live: cannot ask AWS who you are ...', Lambda and GCP rows
    too (the docs: 'no live provider yet'), and the text repeated that reason under every row."""
    code, out, err = invoke("plan", "--model", "llama-2-13b", "--tokens", "2e10", "--live", "--json")
    assert code == 0, err
    doc = json.loads(out)
    catalog = load_catalog()
    clouds = {name: catalog.instance(name).cloud for name in catalog.instances}
    seen = set()
    for row in doc["rows"]:
        cloud = clouds[row["estimate"]["setup"]["instance"]]
        seen.add(cloud)
        (reason,) = row["live"]["reasons"]
        if cloud == "aws":
            assert reason.startswith("not checked live: ")
        else:
            assert "no live provider yet" in reason, reason
    assert "aws" in seen and len(seen) > 1
    code, out, err = invoke("plan", "--model", "llama-2-13b", "--tokens", "2e10", "--live")
    live = " ".join(out[out.index("Live ("):].split())  # the terminal's width decides where lines wrap
    assert live.count("cannot ask AWS who you are") == 1, live


@pytest.mark.parametrize("option, value, kinds", [("--image", "x", "k8s, jobset"),
                                                   ("--shared-fs", "new", "pcluster"),
                                                   ("--service-account", "sa", "k8s, jobset")])
def test_emit_option_for_another_kind_names_the_kinds_that_take_it(option, value, kinds):
    """`--emit slurm --image x` said '(it is for k8s, jobset, pcluster)', but pcluster refuses --image."""
    code, out, err = invoke("run", "--emit", "slurm", option, value, "--", "python", "train.py")
    assert code == 2 and f"(it is for {kinds})" in err, err


def test_email_with_a_trailing_newline_is_refused(dead_env):
    """`$` in the e-mail pattern matched before a final newline: 'ops@example.com\\n' went to AWS Budgets."""
    code, out, err = invoke("account", "--instance", "p5.48xlarge", "--create-budget", "100", "--email",
                            "ops@example.com\n")
    assert code == 2 and "is not an e-mail address" in err, err


@pytest.mark.parametrize("points", [[{"Timestamp": "now", "Maximum": 96.0}], [{"Maximum": 96.0}]])
def test_usage_datapoints_that_are_no_answer_are_left_out(dead_env, points):
    """A CloudWatch datapoint with an infinite value (pydantic refused UsageFact: exit 3) or without a Timestamp
    (KeyError: exit 3) from an endpoint that is not AWS."""
    import datetime as dt

    from trainready.cloud.aws import AwsProvider, QuotaFact

    now = dt.datetime.now(dt.timezone.utc)
    for p in points:
        if p.get("Timestamp") == "now":
            p["Timestamp"] = now
    later = now + dt.timedelta(minutes=5)  # the newest datapoint is the one read: make it the bad one
    points = [*points, {"Timestamp": later, "Maximum": math.inf}, {"Timestamp": later, "Maximum": math.nan}]

    class Client:
        def get_metric_statistics(self, **kw):
            return {"Datapoints": points}

    provider = AwsProvider(Cache(max_age_s=0))
    provider.client = lambda service, region: Client()  # type: ignore[method-assign]
    q = QuotaFact(code="L-417A185B", name="Running On-Demand P instances", value=384.0,
                  usage_dimensions={"Class": "P/OnDemand"}, usage_statistic="Maximum")
    fact, _ = provider.quota_usage("us-east-1", q)
    assert fact.used == (96.0 if "Timestamp" in points[0] else 0.0)


@pytest.mark.parametrize("kind", ["k8s", "jobset"])
@pytest.mark.parametrize("hot", ["/dev/shm", "/dev/shm/", "/dev/shm/ckpt", "/", "/mnt/../dev/shm"])
def test_hot_tier_cannot_share_the_shm_mount_or_be_root(kind, hot):
    """`--hot /dev/shm` emitted two volumeMounts at /dev/shm (the API server refuses: mountPath must be unique),
    and `--hot /` mounted the hot tier over the image's root; the schemas the tests validate with accept both."""
    from trainready.errors import UsageError
    from trainready.run.emit import EmitSpec, emit

    with pytest.raises(UsageError, match="directory of its own"):
        emit(kind, EmitSpec(command=["python", "train.py"], nnodes=2, instance="p5.48xlarge", job_name="run1", hot=hot))
    assert "/mnt/ckpt" in emit(kind, EmitSpec(command=["python", "train.py"], nnodes=2, instance="p5.48xlarge",
                                               job_name="run1", hot="/mnt/ckpt"))


def _fact(cache: Cache) -> None:
    cache.put("k", TypeFact(exists=True))


@pytest.mark.parametrize("parent", ["other-owner", "group-writable", "sticky-shared", "ours"])
def test_the_cache_directorys_parent_is_checked_too(tmp_path, parent):
    """issue 25: the cache checked its `aws` leaf but not the directory above it: a parent owned by another user
    (or writable by others without the sticky bit) lets them swap in a directory of planted answers (a 99,999-vCPU
    quota). The parent must be ours or root's, and not writable by others unless sticky (/tmp)."""
    if os.getuid() != 0 and parent == "other-owner":
        pytest.skip("chown to another user needs root")
    base = tmp_path / "cache"
    base.mkdir(mode=0o700)
    writer = Cache(base, max_age_s=3600)
    _fact(writer)  # an honest answer, written while the parent was fine
    assert writer.get("k", TypeFact) is not None
    if parent == "other-owner":
        os.chown(base, 65534, 65534)
    elif parent == "group-writable":
        os.chmod(base, 0o775)
    elif parent == "sticky-shared":
        os.chmod(base, 0o1777)
    reader = Cache(base, max_age_s=3600)
    got = reader.get("k", TypeFact)
    if parent in ("sticky-shared", "ours"):
        assert got is not None and reader.notes == []
    else:
        assert got is None and len(reader.notes) == 1 and "directory above it" in reader.notes[0], reader.notes
        _fact(reader)  # nor is anything written there
        assert sorted(p.name for p in (base / "aws").iterdir()) == [writer.path("k").name]


def test_the_cache_reads_through_the_directory_it_checked(tmp_path):
    """Files are opened relative to the directory opened and checked once: swapping the directory's path for a
    planted one afterwards changes nothing that is read."""
    base = tmp_path / "cache"
    base.mkdir(mode=0o700)
    cache = Cache(base, max_age_s=3600)
    _fact(cache)
    assert cache.get("k", TypeFact) is not None  # the directory is now open and checked
    (base / "aws").rename(base / "aws-checked")
    planted = base / "aws"
    planted.mkdir(mode=0o700)
    assert cache.get("k", TypeFact) is not None  # still the checked directory's answer, not a miss in the new one
    assert not list(planted.iterdir())
    cache.close()


def test_a_cache_path_through_a_file_or_a_loop_is_a_note_not_a_failure(tmp_path):
    """A cache that cannot be used is a note and every answer is asked again: a path through a file or a symlink
    loop above the cache directory once ended the whole command (exit 2)."""
    (tmp_path / "file").write_text("")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for base in (tmp_path / "file", tmp_path / "loop"):
        cache = Cache(base, max_age_s=3600)
        assert cache.get("k", TypeFact) is None
        _fact(cache)
        assert len(cache.notes) == 1 and "not used" in cache.notes[0], cache.notes
