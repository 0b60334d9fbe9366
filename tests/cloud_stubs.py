"""AWS worlds for `account` and `plan --live` tests, without the internet.

moto's standalone server on 127.0.0.1 answers what it implements (STS, EC2 offerings and instance
types, RunInstances dry runs, SSM's public AMI parameters, budgets, S3, CloudWatch). What moto
lacks or fakes (EC2 quota values, spot placement scores, Capacity Block offerings, capacity
reservations, realistic spot history, Price List products, DecodeAuthorizationMessage) is answered
by botocore's Stubber, per operation (regions are asked concurrently, so responses are matched by
operation, not by call order); each response is validated by botocore against the API's output
shape and written like the AWS API reference's examples.

`no_internet` refuses (and records) any connection or DNS lookup that is not 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from pathlib import Path
from typing import Any

from botocore.stub import Stubber

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
ACCOUNT = "123456789012"  # moto's default account


class OpStubber(Stubber):
    """botocore's Stubber for the operations given a response only; every other call goes to the server.
    A response may carry `match` (a test on the call's parameters): a Price List answer is for one type and
    region, whatever order the threads ask in."""

    def __init__(self, client: Any):
        super().__init__(client)
        self._lock = threading.Lock()
        self._local = threading.local()
        self.matchers: list[Any] = []  # parallel to the queue
        self.calls: list[tuple[str, dict]] = []

    def add(self, method: str, answer: Any, match: Any = None, error: bool = False) -> None:
        if error:
            code, message, status = answer
            self.add_client_error(method, service_error_code=code, service_message=message, http_status_code=status)
        else:
            self.add_response(method, answer)
        self._queue[-1]["match"] = match

    def activate(self) -> None:
        self.client.meta.events.register("before-parameter-build.*.*", self._choose,
                                         unique_id=self._expected_params_event_id)
        self.client.meta.events.register("before-call.*.*", self._answer, unique_id=self._event_id)

    def _choose(self, model: Any, params: dict, context: Any, **kwargs: Any) -> None:
        """Pick the answer from the API parameters (before-call only sees the wire request); same thread."""
        with self._lock:
            for i, item in enumerate(self._queue):
                if item["operation_name"] == model.name and (item["match"] is None or item["match"](params)):
                    del self._queue[i]
                    self.calls.append((model.name, dict(params)))
                    self._local.chosen = item
                    return

    def _answer(self, model: Any, params: dict, context: Any, **kwargs: Any) -> Any:
        item, self._local.chosen = getattr(self._local, "chosen", None), None
        if item is not None and item["operation_name"] == model.name:
            return item["response"]
        return None  # not stubbed: the real call

    def pending(self) -> list[str]:
        return [item["operation_name"] for item in self._queue]


class World:
    """Stubbed responses per (service, region); `install(monkeypatch)` makes the provider use them."""

    def __init__(self) -> None:
        self.stubs: dict[tuple[str, str], list[tuple[str, str, Any]]] = {}
        self.stubbers: dict[tuple[str, str], OpStubber] = {}

    def respond(self, service: str, region: str, method: str, response: dict, repeat: int = 1,
                match: Any = None) -> World:
        self.stubs.setdefault((service, region), []).extend([("ok", method, response, match)] * repeat)
        return self

    def error(self, service: str, region: str, method: str, code: str, message: str = "", status: int = 400,
              repeat: int = 1) -> World:
        self.stubs.setdefault((service, region), []).extend([("error", method, (code, message, status), None)] * repeat)
        return self

    def install(self, monkeypatch: Any) -> World:
        from trainready.cloud import aws

        real = getattr(aws.new_client, "real", aws.new_client)  # a test may install several worlds in turn

        def new_client(session: Any, service: str, region: str) -> Any:
            client = real(session, service, region)
            queued = self.stubs.get((service, region))
            if queued:
                stubber = OpStubber(client)
                for kind, method, answer, match in queued:
                    stubber.add(method, answer, match, error=kind == "error")
                stubber.activate()
                self.stubbers[(service, region)] = stubber
            return client

        new_client.real = real  # type: ignore[attr-defined]
        monkeypatch.setattr(aws, "new_client", new_client)
        return self

    def calls(self, service: str, region: str) -> list[tuple[str, dict]]:
        s = self.stubbers.get((service, region))
        return s.calls if s else []


# ---- responses, shaped like the AWS API reference / CLI examples -------------------------------------------

def quota(code: str, name: str, value: float, klass: str, region: str) -> dict:
    """GetServiceQuota, as in the AWS CLI example (get-aws-default-service-quota --quota-code L-1216C47A)."""
    return {"Quota": {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                      "QuotaArn": f"arn:aws:servicequotas:{region}:{ACCOUNT}:ec2/{code}", "QuotaCode": code,
                      "QuotaName": name, "Value": value, "Unit": "None", "Adjustable": True, "GlobalQuota": False,
                      "UsageMetric": {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
                                      "MetricDimensions": {"Class": klass, "Resource": "vCPU", "Service": "EC2",
                                                           "Type": "Resource"},
                                      "MetricStatisticRecommendation": "Maximum"}}}


def usage(used: float | None) -> dict:
    """GetMetricStatistics on AWS/Usage ResourceCount (Maximum, 5-minute periods)."""
    now = dt.datetime.now(dt.timezone.utc)
    points = [] if used is None else [{"Timestamp": now - dt.timedelta(minutes=m), "Maximum": used, "Unit": "None"}
                                      for m in (5, 10)]
    return {"Label": "ResourceCount", "Datapoints": points}


def spot_history(itype: str, prices: dict[str, list[tuple[float, str]]]) -> dict:
    """DescribeSpotPriceHistory: {az: [(hours ago, "price"), ...]} as price-change records, newest first."""
    now = dt.datetime.now(dt.timezone.utc)
    records = [{"AvailabilityZone": az, "InstanceType": itype, "ProductDescription": "Linux/UNIX", "SpotPrice": price,
                "Timestamp": now - dt.timedelta(hours=ago)}
               for az, series in prices.items() for ago, price in series]
    records.sort(key=lambda r: r["Timestamp"], reverse=True)
    return {"SpotPriceHistory": records}


def placement_scores(scores: list[tuple[str, str, int]]) -> dict:
    """GetSpotPlacementScores with SingleAvailabilityZone=true (AWS CLI example: Region, AvailabilityZoneId, Score)."""
    return {"SpotPlacementScores": [{"Region": r, "AvailabilityZoneId": az, "Score": s} for r, az, s in scores]}


def capacity_blocks(itype: str, offers: list[tuple[str, int, int, int, str]]) -> dict:
    """DescribeCapacityBlockOfferings: (AZ, instances, hours, starts in days, upfront fee USD)."""
    now = dt.datetime.now(dt.timezone.utc).replace(hour=11, minute=30, second=0, microsecond=0)
    out = []
    for i, (az, count, hours, days, fee) in enumerate(offers):
        start = now + dt.timedelta(days=days)
        out.append({"CapacityBlockOfferingId": f"cb-0123456789abcdef{i}", "InstanceType": itype, "AvailabilityZone": az,
                    "InstanceCount": count, "StartDate": start, "EndDate": start + dt.timedelta(hours=hours),
                    "CapacityBlockDurationHours": hours, "UpfrontFee": fee, "CurrencyCode": "USD",
                    "Tenancy": "default"})
    return {"CapacityBlockOfferings": out}


def reservations(itype: str, items: list[tuple[str, int, int]]) -> dict:
    """DescribeCapacityReservations: (AZ, total, available)."""
    return {"CapacityReservations": [
        {"CapacityReservationId": f"cr-1234abcd56EXAMPLE{i}", "OwnerId": ACCOUNT, "InstanceType": itype,
         "InstancePlatform": "Linux/UNIX", "AvailabilityZone": az, "Tenancy": "default", "TotalInstanceCount": total,
         "AvailableInstanceCount": free, "State": "active", "InstanceMatchCriteria": "open"}
        for i, (az, total, free) in enumerate(items)]}


def price_list(itype: str, region: str, usd: str, published: str = "2026-11-20T18:04:43Z") -> dict:
    """Pricing GetProducts: one product as the Price List API returns it (a JSON document in a string)."""
    product = {
        "product": {"productFamily": "Compute Instance", "sku": "JRTCKXETXF7XHQYW",
                    "attributes": {"instanceType": itype, "regionCode": region, "operatingSystem": "Linux",
                                   "tenancy": "Shared", "capacitystatus": "Used", "preInstalledSw": "NA",
                                   "licenseModel": "No License required", "marketoption": "OnDemand",
                                   "servicecode": "AmazonEC2"}},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {"JRTCKXETXF7XHQYW.JRTCKXETXF": {
            "priceDimensions": {"JRTCKXETXF7XHQYW.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                "description": f"${usd} per On Demand Linux {itype} Instance Hour",
                "rateCode": "JRTCKXETXF7XHQYW.JRTCKXETXF.6YS6EN2CT7", "pricePerUnit": {"USD": usd}}},
            "sku": "JRTCKXETXF7XHQYW", "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
            "termAttributes": {}}}},
        "version": "20261120180443", "publicationDate": published}
    return {"FormatVersion": "aws_v1", "PriceList": [json.dumps(product)]}


ENCODED = "AQoDYXdzEKL3ZxzOcY0NVQEXAMPLEencodedmessage"


def denied_message() -> str:
    """What EC2 says for UnauthorizedOperation (the encoded part decodes with sts:DecodeAuthorizationMessage)."""
    return f"You are not authorized to perform this operation. Encoded authorization failure message: {ENCODED}"


def decoded(region: str) -> dict:
    """DecodeAuthorizationMessage, as in the STS API reference example."""
    doc = {"allowed": False, "explicitDeny": True, "matchedStatements": {"items": []}, "failures": {"items": []},
           "context": {"principal": {"id": "AIDACKCEVSQ6C2EXAMPLE", "name": "trainer"}, "action": "ec2:RunInstances",
                       "resource": f"arn:aws:ec2:{region}:{ACCOUNT}:instance/*", "conditions": {"items": []}}}
    return {"DecodedMessage": json.dumps(doc)}


# ---- the environment --------------------------------------------------------------------------------------

def aws_env(monkeypatch: Any, tmp_path: Path, endpoint: str | None, *, attempts: int = 2, creds: bool = True) -> None:
    """Every AWS setting a test controls: endpoint, fake credentials, no profile or config file, no instance
    metadata, few retries, a fresh cache."""
    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_RETRY_MODE", "AWS_REGION"):
        monkeypatch.delenv(key, raising=False)
    for key in list(__import__("os").environ):
        if key.startswith("AWS_ENDPOINT_URL"):
            monkeypatch.delenv(key, raising=False)
    env = {"AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": str(attempts), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-creds"),
           "TRAINREADY_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "100"}
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    if creds:
        env.update({"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",  # the AWS documentation's example key
                    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"})
    else:
        monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


@contextmanager
def no_internet(monkeypatch: Any) -> Iterator[list[str]]:
    """Refuse and record every connection and name lookup that leaves 127.0.0.1."""
    tried: list[str] = []
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if str(host) not in LOOPBACK:
            tried.append(f"dns {host}")
            raise socket.gaierror(socket.EAI_NONAME, "tests never leave 127.0.0.1")
        return real_getaddrinfo(host, *args, **kwargs)

    def connect(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else str(address)
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in LOOPBACK:
            tried.append(f"connect {address}")
            raise ConnectionRefusedError("tests never leave 127.0.0.1")
        return real_connect(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    yield tried


def invoke(*args: str) -> tuple[int, str, str]:
    """`trainready ARGS` in this process (stubs apply), as the console script runs it: (exit, stdout, stderr)."""
    from trainready.cli import main

    if "s3fs" in sys.modules:  # a process of its own starts without fsspec's cached S3 clients and their listings
        sys.modules["s3fs"].S3FileSystem.clear_instance_cache()
    old_argv, old_out, old_err = sys.argv, sys.stdout, sys.stderr
    sys.argv = ["trainready", *args]
    sys.stdout, sys.stderr = StringIO(), StringIO()
    code = 0
    try:
        main.run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        out, err = sys.stdout.getvalue(), sys.stderr.getvalue()
        sys.argv, sys.stdout, sys.stderr = old_argv, old_out, old_err
    return code, out, err


OUR_VARIABLES = ("TRAINREADY_", "AWS_", "NCCL_", "XDG_")
"""Variables a command reads: a call given `env` sees only the ones it names, as a process started with that
environment would."""


def cli_run(*args: object, columns: int = 200, cwd=None, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
    """`trainready ARGS` in this process (invoke) at `columns` (Rich wraps at the terminal width), in `cwd`: what
    subprocess.run gives, without the 3-5 s of a fresh interpreter per call (issue 25). `env`: variables set for
    the call, every OUR_VARIABLES one it does not name unset (restored after). Tests of what only a real process
    shows (its whole environment, a pipe, signals, a hang cut by a timeout) keep subprocess.run."""
    from trainready.cli import console

    saved = dict(os.environ)
    if env is not None:
        for name in [n for n in os.environ if n.startswith(OUR_VARIABLES) and n not in env]:
            del os.environ[name]
        os.environ.update({k: v for k, v in env.items() if k not in ("COLUMNS", "PATH")})
    try:
        return _cli_run(args, columns, cwd, console)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _cli_run(args: tuple, columns: int, cwd, console) -> subprocess.CompletedProcess:
    old_columns, old_cwd = os.environ.get("COLUMNS"), os.getcwd()
    # Rich reads COLUMNS once, when the console is made (at import): the consoles of this process get the width
    old_widths = console.out._width, console.err._width
    old_colors = console.out._color_system, console.err._color_system
    os.environ["COLUMNS"] = str(columns)
    console.out.width = console.err.width = columns
    console.out._color_system = console.err._color_system = None  # as through a pipe, whatever the import saw
    try:
        if cwd is not None:
            os.chdir(cwd)
        code, out, err = invoke(*map(str, args))
    finally:
        os.chdir(old_cwd)
        console.out._width, console.err._width = old_widths
        console.out._color_system, console.err._color_system = old_colors
        if old_columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old_columns
    return subprocess.CompletedProcess(["trainready", *map(str, args)], code, out, err)
