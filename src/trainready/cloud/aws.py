"""AWS: every call trainready makes to an account, behind one provider object.

Each method asks one question (offerings, a quota, spot history, ...) and returns a typed fact, or
raises CallFailed naming the IAM action and why (denied, throttled after botocore's retries,
unsupported, unreachable); it never decides what the answer means for a job (account.py does).
Clients are made once per (service, region), with botocore's standard retry mode (adaptive when
the user chose it in AWS_RETRY_MODE or the config file) and short timeouts. botocore itself honours
AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE> (e.g. AWS_ENDPOINT_URL_EC2), so a private endpoint
or a test server takes every call. Read-only answers are cached (cache.py) per account.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from trainready.errors import UsageError, printable
from trainready.io import parse_json, redact

from .cache import Cache
from .report import CapacityBlock, Reservation

CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 20.0
DEADLINE_S = 60.0
"""The whole of one command's AWS calls (account, plan --live): after it every unanswered line is unknown and the
command returns. botocore's timeouts are per connection attempt and per read, and it retries, so an endpoint that
hangs or sends a byte every few seconds would otherwise hold a command for minutes or for ever.
TRAINREADY_LIVE_DEADLINE_S, `account --deadline` or `plan --live-deadline` sets it."""


def deadline_s_from_env() -> float:
    """TRAINREADY_LIVE_DEADLINE_S as seconds (> 0), else DEADLINE_S; a bad value is a UsageError naming it."""
    text = os.environ.get("TRAINREADY_LIVE_DEADLINE_S")
    if text is None or not text.strip():
        return DEADLINE_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value < 24 * 3600):
        raise UsageError(f"TRAINREADY_LIVE_DEADLINE_S={printable(text)!r}: seconds, more than 0 and less than 86400 "
                         f"(e.g. 60)")
    return value
SPOT_HISTORY_DAYS = 7
SPOT_HISTORY_MAX_ITEMS = 20_000  # a week of changes for one type in one region is a few hundred
BUCKET_LIST_MAX_OBJECTS = 200_000  # size of a dataset prefix: past this, "at least"
# Public SSM parameters AWS keeps pointing at the newest Amazon Linux 2023 AMI: RunInstances needs an
# image id even for a dry run (Amazon Linux 2023 User Guide, "Launch AL2023 using the SSM parameter").
AMI_PARAMETER = {"x86_64": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
                 "arm64": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64"}
# The Price List query API answers in us-east-1 (and ap-south-1, eu-central-1) for every region
# (AWS Price List API docs, "Endpoints").
PRICING_REGION = "us-east-1"
_ENCODED = re.compile(r"Encoded authorization failure message:\s*(\S+)")
_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess",
           "AuthorizationError", "Forbidden", "403"}
_THROTTLED = {"Throttling", "ThrottlingException", "ThrottledException", "RequestLimitExceeded",
              "TooManyRequestsException", "RequestThrottled", "SlowDown", "PriorRequestNotComplete"}
_CREDENTIALS = {"ExpiredToken", "ExpiredTokenException", "RequestExpired", "InvalidClientTokenId",
                "InvalidAccessKeyId", "SignatureDoesNotMatch", "AuthFailure", "UnrecognizedClientException",
                "InvalidToken"}
HOW_TO_LOG_IN = ("set AWS_PROFILE (after `aws configure` or `aws sso login`), or AWS_ACCESS_KEY_ID and "
                 "AWS_SECRET_ACCESS_KEY, or run on an instance with an IAM role")

F = TypeVar("F", bound=BaseModel)


class CallFailed(Exception):
    """A call that gave no answer: `kind` is denied, throttled, unsupported, unreachable, credentials,
    not-found or error; `action` the IAM action it needed."""

    def __init__(self, action: str, kind: str, reason: str, code: str = "", message: str = ""):
        # botocore quotes the endpoint (AWS_ENDPOINT_URL may hold user:password) and AWS quotes what it was sent:
        # redacted here, so no line, --json field or page built from a failed call can carry it (classify also
        # redacts before it cuts a long message: a cut can drop the '@' that marks a URL's password)
        reason, message = redact(reason), redact(message)
        super().__init__(reason)
        self.action, self.kind, self.reason, self.code, self.message = action, kind, reason, code, message


class NoAccess(UsageError):
    """No credentials, credentials AWS refuses, or no AWS at all: nothing can be checked (exit 2)."""


def missing_boto() -> str | None:
    """Why the AWS provider cannot run here, or None."""
    try:
        import boto3  # noqa: F401
        import botocore  # noqa: F401
    except ImportError:
        return "boto3 is not installed: pip install 'trainready[s3]'"
    return None


def client_config(session: Any) -> Any:
    from botocore.config import Config

    core = getattr(session, "_session", session)  # boto3's Session wraps botocore's, which reads the config
    mode = core.get_config_variable("retry_mode")  # AWS_RETRY_MODE / config file; botocore's default: legacy
    try:  # botocore reads it with int() when it makes a client: 'abc' would be a ValueError deep inside
        core.get_config_variable("max_attempts")
    except ValueError:
        raise NoAccess("AWS_MAX_ATTEMPTS (or max_attempts in the AWS config file) is not a whole number: "
                       "give e.g. 3, or unset it") from None
    return Config(retries={"mode": mode if mode in ("standard", "adaptive") else "standard"},
                  connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S, user_agent_extra="trainready")


def new_client(session: Any, service: str, region: str) -> Any:
    """A botocore client (tests replace this to stub what moto does not implement)."""
    return session.client(service, region_name=region, config=client_config(session))


def classify(exc: BaseException, action: str) -> CallFailed:
    """Any exception from a call, as a CallFailed a user can act on."""
    from botocore import exceptions as be
    from botocore.parsers import ResponseParserError

    if isinstance(exc, be.ClientError):
        err = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
        code = str(err.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "") or "")
        message = " ".join(str(err.get("Message") or "").split())
        attempts = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        if code in _DENIED or code.endswith("AccessDenied"):
            return CallFailed(action, "denied", f"denied: needs {action}", code, message)
        if code in _THROTTLED:
            return CallFailed(action, "throttled", f"throttled ({code}) after {attempts + 1} attempts "
                                                   f"(botocore's retries): try again later", code)
        if code in _CREDENTIALS:
            return CallFailed(action, "credentials", f"credentials refused ({code}): {HOW_TO_LOG_IN}", code)
        if code in ("NoSuchResourceException", "NoSuchBucket", "NotFound", "404", "ParameterNotFound"):
            return CallFailed(action, "not-found", f"{code}: {message}" if message else code, code)
        if code in ("UnsupportedOperation", "InvalidAction", "OptInRequired", "UnknownOperationException",
                    "NotImplemented") or code.startswith("5"):
            what = "not supported here" if not code.startswith("5") else f"the service failed (HTTP {code})"
            return CallFailed(action, "unsupported", redact(f"{what}: {message}")[:300] if message else what, code)
        return CallFailed(action, "error", redact(f"{code}: {message}")[:300], code)
    if isinstance(exc, (be.NoCredentialsError, be.PartialCredentialsError)):
        return CallFailed(action, "credentials", f"no AWS credentials: {HOW_TO_LOG_IN}")
    if isinstance(exc, (be.TokenRetrievalError, be.SSOTokenLoadError, be.UnauthorizedSSOTokenError)):
        return CallFailed(action, "credentials", f"the SSO login has expired ({type(exc).__name__}): "
                                                 f"run `aws sso login`")
    if isinstance(exc, (be.EndpointConnectionError, be.ConnectTimeoutError, be.ReadTimeoutError,
                        be.ConnectionClosedError)):
        return CallFailed(action, "unreachable", redact(f"cannot reach AWS: {printable(exc)}")[:300])
    if isinstance(exc, ResponseParserError):
        return CallFailed(action, "unsupported", "the endpoint's answer is not the AWS API's (ResponseParserError): "
                                                 "is AWS_ENDPOINT_URL a server that implements it?")
    if isinstance(exc, be.BotoCoreError):
        return CallFailed(action, "error", redact(printable(" ".join(str(exc).split())))[:300])
    raise exc  # a bug of ours: not hidden as an "unknown" line


class _Fact(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class TypeFact(_Fact):
    exists: bool
    vcpus: int | None = None
    efa: bool | None = None
    network_cards: int | None = None
    efa_interfaces: int | None = None
    architectures: list[str] = []


class AzList(_Fact):
    azs: list[str]


class QuotaFact(_Fact):
    code: str
    name: str
    value: float | None
    usage_dimensions: dict[str, str] | None = None
    usage_statistic: str | None = None


class UsageFact(_Fact):
    used: float | None
    datapoints: int = Field(0, ge=0)


class SpotStats(_Fact):
    by_az: dict[str, float]
    min: float | None
    median: float | None
    max: float | None
    records: int


class Score(_Fact):
    score: int = Field(ge=1, le=10)
    az_id: str | None = None


class Scores(_Fact):
    by_region: dict[str, Score]


class Blocks(_Fact):
    blocks: list[CapacityBlock]


class Reservations(_Fact):
    items: list[Reservation]


class PriceFact(_Fact):
    usd_per_hour: float | None
    as_of: str | None
    products: int


class Text(_Fact):
    value: str


class BucketSize(_Fact):
    bytes: int
    objects: int
    complete: bool


class BudgetFact(_Fact):
    name: str
    limit_usd: float | None
    time_unit: str | None


class AwsProvider:
    """One account, as the current credentials see it. Thread-safe: regions are asked concurrently,
    each with its own clients."""

    name = "aws"

    def __init__(self, cache: Cache, session: Any = None, deadline_s: float | None = None):
        import boto3
        from botocore.exceptions import BotoCoreError

        try:
            self.session = session or boto3.session.Session()
        except BotoCoreError as exc:  # AWS_PROFILE names a profile that is not there, a broken config file
            raise NoAccess(f"AWS configuration: {printable(' '.join(str(exc).split()))}: {HOW_TO_LOG_IN}") from None
        client_config(self.session)  # a broken AWS_MAX_ATTEMPTS: exit 2 (account) or catalog prices (plan --live)
        self.cache = cache
        self.account: str | None = None
        self.arn: str | None = None
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self.calls: dict[str, dict[str, tuple[str, str]]] = {}  # scope -> action -> (kind, reason)
        self._memo: dict[str, Any] = {}  # this run's answers (or failures) by question
        self._key_locks: dict[str, threading.Lock] = {}
        self.deadline_s = deadline_s
        self._deadline = None if deadline_s is None else time.monotonic() + deadline_s

    # ---- plumbing ---------------------------------------------------------------------------------------
    def client(self, service: str, region: str) -> Any:
        key = (service, region)
        with self._lock:  # a session is not thread-safe; clients are, once made
            if key not in self._clients:
                self._clients[key] = new_client(self.session, service, region)
            return self._clients[key]

    def _log(self, scope: str, action: str, kind: str, reason: str) -> None:
        with self._lock:
            seen = self.calls.setdefault(scope, {})
            if kind != "allowed" or action not in seen:
                seen[action] = (kind, reason)

    def _bounded(self, ask: Callable[[], Any], action: str) -> Any:
        """ask() within what is left of the command's deadline: past it, or with no answer by then, a CallFailed
        ('unreachable': the line is unknown). The call goes on in a daemon thread the process does not wait for."""
        if self._deadline is None:
            return ask()
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise CallFailed(action, "unreachable", f"not asked: the {self.deadline_s:g} s deadline for AWS calls "
                                                    f"had passed (account --deadline, plan --live-deadline, "
                                                    f"TRAINREADY_LIVE_DEADLINE_S)")
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["answer"] = ask()
            except BaseException as exc:  # handed to the caller's thread as it is
                box["error"] = exc
            finally:
                done.set()
        threading.Thread(target=run, daemon=True, name="trainready-aws-call").start()
        if not done.wait(left):
            raise CallFailed(action, "unreachable", f"no answer within the {self.deadline_s:g} s deadline for AWS "
                                                    f"calls (account --deadline, plan --live-deadline, "
                                                    f"TRAINREADY_LIVE_DEADLINE_S)")
        if "error" in box:
            raise box["error"]
        return box["answer"]

    def _call(self, scope: str, service: str, region: str, op: str, action: str, **params: Any) -> dict:
        try:
            answer = self._bounded(lambda: getattr(self.client(service, region), op)(**params), action)
        except CallFailed as failed:
            self._log(scope, action, failed.kind, failed.reason)
            raise
        except Exception as exc:
            failed = classify(exc, action)
            self._log(scope, action, failed.kind, failed.reason)
            raise failed from None
        self._log(scope, action, "allowed", "allowed")
        return answer

    def _pages(self, scope: str, service: str, region: str, op: str, action: str, max_items: int,
               **params: Any) -> Iterator[dict]:
        try:
            pages = self._bounded(lambda: list(self.client(service, region).get_paginator(op).paginate(
                **params, PaginationConfig={"MaxItems": max_items})), action)
        except CallFailed as failed:
            self._log(scope, action, failed.kind, failed.reason)
            raise
        except Exception as exc:
            failed = classify(exc, action)
            self._log(scope, action, failed.kind, failed.reason)
            raise failed from None
        yield from pages
        self._log(scope, action, "allowed", "allowed")

    def _cached(self, scope: str, question: list[Any], model: type[F], ask: Callable[[], F],
                action: str) -> tuple[F, float | None]:
        """(answer, its age in seconds when it came from the cache). Asked once per run: threads that want
        the same answer (plan rows of one type in one region) wait for the first, which also reads and
        writes the disk cache; a failure is remembered for the run too."""
        key = json.dumps([self.account, scope, *question], sort_keys=True, default=str)
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            if key in self._memo:
                got = self._memo[key]
                if isinstance(got, CallFailed):
                    raise got
                return got
            hit = self.cache.get(key, model)
            if hit is not None:
                self._log(scope, action, "allowed", f"allowed (answer from the cache, {hit[1] / 60:.0f} min old)")
                self._memo[key] = hit
                return hit
            try:
                answer = ask()
            except CallFailed as exc:
                self._memo[key] = exc
                raise
            self.cache.put(key, answer)
            self._memo[key] = (answer, None)
            return answer, None

    # ---- identity and regions ------------------------------------------------------------------------------
    def identity(self) -> tuple[str, str]:
        """(account, ARN) of the caller; NoAccess when there are no usable credentials or no AWS."""
        if self.account is not None and self.arn is not None:
            return self.account, self.arn
        try:  # within the deadline: a credential_process or an instance role's metadata service can hang too
            creds = self._bounded(self.session.get_credentials, "sts:GetCallerIdentity")
        except CallFailed as exc:
            raise NoAccess(f"AWS credentials: {exc.reason}") from None
        except Exception as exc:  # noqa: BLE001 - a credential process, SSO cache or role that fails
            failed = classify(exc, "sts:GetCallerIdentity") if _is_boto(exc) else None
            raise NoAccess(f"AWS credentials: {failed.reason if failed else printable(exc)}") from None
        if creds is None:
            raise NoAccess(f"no AWS credentials found: {HOW_TO_LOG_IN}")
        region = self.session.region_name or "us-east-1"
        try:
            who = self._call("global", "sts", region, "get_caller_identity", "sts:GetCallerIdentity")
        except CallFailed as exc:
            if exc.kind in ("credentials", "denied"):
                raise NoAccess(f"AWS refused the credentials: {exc.reason}") from None
            raise NoAccess(f"cannot ask AWS who you are (sts:GetCallerIdentity): {exc.reason}") from None
        account, arn = who.get("Account"), who.get("Arn")
        if not isinstance(account, str) or not isinstance(arn, str):
            raise NoAccess("sts:GetCallerIdentity gave no account: is AWS_ENDPOINT_URL the AWS API?")
        self.account, self.arn = account, arn
        return account, arn

    def enabled_regions(self) -> list[str]:
        region = self.session.region_name or "us-east-1"
        answer = self._call("global", "ec2", region, "describe_regions", "ec2:DescribeRegions")
        return sorted(r["RegionName"] for r in answer.get("Regions", []) if isinstance(r.get("RegionName"), str))

    # ---- the instance type in a region ---------------------------------------------------------------------
    def instance_type(self, region: str, itype: str) -> tuple[TypeFact, float | None]:
        def ask() -> TypeFact:
            try:
                answer = self._call(region, "ec2", region, "describe_instance_types", "ec2:DescribeInstanceTypes",
                                    InstanceTypes=[itype])
            except CallFailed as exc:
                if exc.code in ("InvalidInstanceType", "InvalidParameterValue"):
                    return TypeFact(exists=False)
                raise
            found = [t for t in answer.get("InstanceTypes", []) if t.get("InstanceType") == itype]
            if not found:
                return TypeFact(exists=False)
            t = found[0]
            net = t.get("NetworkInfo", {})
            return TypeFact(exists=True, vcpus=_int(t.get("VCpuInfo", {}).get("DefaultVCpus")),
                            efa=_bool(net.get("EfaSupported")), network_cards=_int(net.get("MaximumNetworkCards")),
                            efa_interfaces=_int(net.get("EfaInfo", {}).get("MaximumEfaInterfaces")),
                            architectures=[a for a in t.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
                                           if isinstance(a, str)])
        return self._cached(region, ["instance_type", itype], TypeFact, ask, "ec2:DescribeInstanceTypes")

    def offerings(self, region: str, itype: str) -> tuple[AzList, float | None]:
        def ask() -> AzList:
            azs: set[str] = set()
            for page in self._pages(region, "ec2", region, "describe_instance_type_offerings",
                                    "ec2:DescribeInstanceTypeOfferings", 1000, LocationType="availability-zone",
                                    Filters=[{"Name": "instance-type", "Values": [itype]}]):
                azs.update(o["Location"] for o in page.get("InstanceTypeOfferings", [])
                           if o.get("InstanceType") == itype and isinstance(o.get("Location"), str))
            return AzList(azs=sorted(azs))
        return self._cached(region, ["offerings", itype], AzList, ask, "ec2:DescribeInstanceTypeOfferings")

    # ---- quotas ----------------------------------------------------------------------------------------------
    def quota(self, region: str, code: str) -> tuple[QuotaFact, float | None]:
        def ask() -> QuotaFact:
            q = self._call(region, "service-quotas", region, "get_service_quota", "servicequotas:GetServiceQuota",
                           ServiceCode="ec2", QuotaCode=code).get("Quota", {})
            if q.get("QuotaCode") not in (None, code):
                raise CallFailed("servicequotas:GetServiceQuota", "error", f"asked for {code}, the answer is for "
                                                                           f"{printable(q.get('QuotaCode'))[:20]}")
            metric = q.get("UsageMetric") or {}
            dims = metric.get("MetricDimensions")
            ok_dims = isinstance(dims, dict) and all(isinstance(v, str) for v in dims.values()) and \
                metric.get("MetricNamespace") == "AWS/Usage" and metric.get("MetricName") == "ResourceCount"
            return QuotaFact(code=code, name=str(q.get("QuotaName") or code), value=_float(q.get("Value")),
                             usage_dimensions=dict(dims) if ok_dims else None,
                             usage_statistic=str(metric.get("MetricStatisticRecommendation") or "Maximum")
                             if ok_dims else None)
        return self._cached(region, ["quota", code], QuotaFact, ask, "servicequotas:GetServiceQuota")

    def quota_usage(self, region: str, quota: QuotaFact) -> tuple[UsageFact, float | None]:
        """vCPUs in use now, from the quota's CloudWatch usage metric (AWS/Usage ResourceCount)."""
        if not quota.usage_dimensions:
            return UsageFact(used=None), None

        def ask() -> UsageFact:
            now = dt.datetime.now(dt.timezone.utc)
            stat = quota.usage_statistic if quota.usage_statistic in ("Maximum", "Average", "Sum") else "Maximum"
            answer = self._call(region, "cloudwatch", region, "get_metric_statistics", "cloudwatch:GetMetricStatistics",
                                Namespace="AWS/Usage", MetricName="ResourceCount",
                                Dimensions=[{"Name": k, "Value": v} for k, v in sorted(quota.usage_dimensions.items())],
                                StartTime=now - dt.timedelta(hours=1), EndTime=now, Period=300, Statistics=[stat])
            # a datapoint without a time or with a value that is not a finite number is no answer (an endpoint
            # that is not AWS): left out, as UsageFact would refuse it past classify()
            points = [p for p in answer.get("Datapoints", []) if _float(p.get(stat)) is not None
                      and isinstance(p.get("Timestamp"), dt.datetime)]
            if not points:  # AWS/Usage publishes while something of the class runs: none this hour counts as 0
                return UsageFact(used=0.0, datapoints=0)
            return UsageFact(used=_float(max(points, key=lambda p: p["Timestamp"])[stat]), datapoints=len(points))
        return self._cached(region, ["usage", quota.code], UsageFact, ask, "cloudwatch:GetMetricStatistics")

    def request_quota(self, region: str, code: str, value: int) -> tuple[str | None, str | None]:
        answer = self._call(region, "service-quotas", region, "request_service_quota_increase",
                            "servicequotas:RequestServiceQuotaIncrease", ServiceCode="ec2", QuotaCode=code,
                            DesiredValue=float(value))
        req = answer.get("RequestedQuota", {})
        return _str(req.get("Id")), _str(req.get("Status"))

    # ---- permissions -----------------------------------------------------------------------------------------
    def ami(self, region: str, arch: str) -> tuple[Text, float | None]:
        name = AMI_PARAMETER.get(arch, AMI_PARAMETER["x86_64"])

        def ask() -> Text:
            answer = self._call(region, "ssm", region, "get_parameter", "ssm:GetParameter", Name=name)
            value = answer.get("Parameter", {}).get("Value")
            if not isinstance(value, str) or not value.startswith("ami-"):
                raise CallFailed("ssm:GetParameter", "error", f"{name} holds no AMI id")
            return Text(value=value)
        return self._cached(region, ["ami", name], Text, ask, "ssm:GetParameter")

    def dry_run(self, region: str, itype: str, nodes: int, spot: bool, ami: str) -> tuple[str, str]:
        """RunInstances with DryRun: ("allowed", ""), ("denied", encoded message or ""), or (error code, message)."""
        params: dict[str, Any] = {"ImageId": ami, "InstanceType": itype, "MinCount": nodes, "MaxCount": nodes,
                                  "DryRun": True}
        if spot:
            params["InstanceMarketOptions"] = {"MarketType": "spot"}
        try:
            self._call(region, "ec2", region, "run_instances", "ec2:RunInstances", **params)
        except CallFailed as exc:
            if exc.code == "DryRunOperation":
                self._log(region, "ec2:RunInstances", "allowed", "allowed (dry run)")
                return "allowed", ""
            if exc.code == "UnauthorizedOperation":
                found = _ENCODED.search(exc.message)
                return "denied", found.group(1) if found else ""
            return exc.code or exc.kind, exc.reason
        return "allowed", ""  # a server that ignores DryRun (none should)

    def decode(self, encoded: str) -> str:
        """Why RunInstances was denied, in AWS's words (sts:DecodeAuthorizationMessage)."""
        answer = self._call("global", "sts", self.session.region_name or "us-east-1", "decode_authorization_message",
                            "sts:DecodeAuthorizationMessage", EncodedMessage=encoded)
        try:
            doc = parse_json(answer.get("DecodedMessage", ""))
            ctx = doc.get("context", {})
            verdict = "allowed" if doc.get("allowed") else "denied"
            return f"{ctx.get('action', '?')} on {ctx.get('resource', '?')}: {verdict}" \
                   f"{' by an explicit deny' if doc.get('explicitDeny') else ''}"
        except (ValueError, AttributeError, TypeError):
            return printable(str(answer.get("DecodedMessage", "")))[:300]

    # ---- capacity and price ----------------------------------------------------------------------------------
    def spot_history(self, region: str, itype: str) -> tuple[SpotStats, float | None]:
        def ask() -> SpotStats:
            now = dt.datetime.now(dt.timezone.utc)
            start = now - dt.timedelta(days=SPOT_HISTORY_DAYS)
            records: list[tuple[str, float, dt.datetime]] = []
            for page in self._pages(region, "ec2", region, "describe_spot_price_history",
                                    "ec2:DescribeSpotPriceHistory", SPOT_HISTORY_MAX_ITEMS, InstanceTypes=[itype],
                                    ProductDescriptions=["Linux/UNIX"], StartTime=start, EndTime=now):
                for r in page.get("SpotPriceHistory", []):
                    price, ts, az = _float(r.get("SpotPrice")), r.get("Timestamp"), r.get("AvailabilityZone")
                    if price is not None and price > 0 and isinstance(ts, dt.datetime) and isinstance(az, str):
                        records.append((az, price, ts))
            return spot_stats(records, start, now)
        return self._cached(region, ["spot_history", itype], SpotStats, ask, "ec2:DescribeSpotPriceHistory")

    def placement_scores(self, regions: list[str], itype: str, nodes: int) -> tuple[Scores, float | None]:
        home = regions[0]

        def ask() -> Scores:
            best: dict[str, Score] = {}
            for page in self._pages(home, "ec2", home, "get_spot_placement_scores", "ec2:GetSpotPlacementScores", 1000,
                                    InstanceTypes=[itype], TargetCapacity=nodes, TargetCapacityUnitType="units",
                                    SingleAvailabilityZone=True, RegionNames=regions):
                for s in page.get("SpotPlacementScores", []):
                    region, score = s.get("Region"), _int(s.get("Score"))
                    if isinstance(region, str) and score is not None and 1 <= score <= 10 and \
                            (region not in best or score > best[region].score):
                        best[region] = Score(score=score, az_id=_str(s.get("AvailabilityZoneId")))
            return Scores(by_region=best)
        return self._cached("global", ["placement", sorted(regions), itype, nodes], Scores, ask,
                            "ec2:GetSpotPlacementScores")

    def capacity_blocks(self, region: str, itype: str, count: int, hours: int) -> tuple[Blocks, float | None]:
        def ask() -> Blocks:
            blocks = []
            for page in self._pages(region, "ec2", region, "describe_capacity_block_offerings",
                                    "ec2:DescribeCapacityBlockOfferings", 500, InstanceType=itype,
                                    InstanceCount=count, CapacityDurationHours=hours):
                for o in page.get("CapacityBlockOfferings", []):
                    start, end = o.get("StartDate"), o.get("EndDate")
                    if not isinstance(start, dt.datetime) or not isinstance(end, dt.datetime):
                        continue
                    fee = _float(o.get("UpfrontFee")) if o.get("CurrencyCode", "USD") == "USD" else None
                    n, h = _int(o.get("InstanceCount")) or count, _int(o.get("CapacityBlockDurationHours"))
                    blocks.append(CapacityBlock(start=_iso(start), end=_iso(end), instance_count=n, upfront_fee_usd=fee,
                                                availability_zone=_str(o.get("AvailabilityZone")), duration_hours=h,
                                                usd_per_instance_hour=fee / n / h if fee and h else None))
            blocks.sort(key=lambda b: (b.upfront_fee_usd if b.upfront_fee_usd is not None else float("inf"), b.start))
            return Blocks(blocks=blocks)
        return self._cached(region, ["capacity_blocks", itype, count, hours], Blocks, ask,
                            "ec2:DescribeCapacityBlockOfferings")

    def reservations(self, region: str, itype: str) -> tuple[Reservations, float | None]:
        def ask() -> Reservations:
            items = []
            for page in self._pages(region, "ec2", region, "describe_capacity_reservations",
                                    "ec2:DescribeCapacityReservations", 1000,
                                    Filters=[{"Name": "instance-type", "Values": [itype]},
                                             {"Name": "state", "Values": ["active", "pending", "scheduled"]}]):
                for r in page.get("CapacityReservations", []):
                    end = r.get("EndDate")
                    items.append(Reservation(id=str(r.get("CapacityReservationId", "?")),
                                             availability_zone=_str(r.get("AvailabilityZone")),
                                             total=_int(r.get("TotalInstanceCount")) or 0,
                                             available=_int(r.get("AvailableInstanceCount")) or 0,
                                             state=str(r.get("State", "?")),
                                             end=_iso(end) if isinstance(end, dt.datetime) else None))
            return Reservations(items=items)
        return self._cached(region, ["reservations", itype], Reservations, ask, "ec2:DescribeCapacityReservations")

    def on_demand_price(self, region: str, itype: str) -> tuple[PriceFact, float | None]:
        """Linux, shared tenancy, no pre-installed software, on-demand (not Capacity Block) $/hour."""
        def ask() -> PriceFact:
            filters = {"instanceType": itype, "regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared",
                       "preInstalledSw": "NA", "capacitystatus": "Used", "licenseModel": "No License required",
                       "marketoption": "OnDemand"}
            prices: set[float] = set()
            as_of: str | None = None
            products = 0
            for page in self._pages("global", "pricing", PRICING_REGION, "get_products", "pricing:GetProducts", 100,
                                    ServiceCode="AmazonEC2",
                                    Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v}
                                             for k, v in filters.items()]):
                for item in page.get("PriceList", []):
                    usd, published = _price_of(item)
                    products += 1
                    if usd is not None and usd > 0:
                        prices.add(usd)
                        as_of = published or as_of
            return PriceFact(usd_per_hour=min(prices) if prices else None, as_of=as_of, products=products)
        return self._cached(region, ["on_demand_price", itype], PriceFact, ask, "pricing:GetProducts")

    # ---- account-wide ----------------------------------------------------------------------------------------
    def budgets(self) -> list[BudgetFact]:
        found = []
        for page in self._pages("global", "budgets", "us-east-1", "describe_budgets", "budgets:ViewBudget", 1000,
                                AccountId=self.account):
            for b in page.get("Budgets", []):
                if b.get("BudgetType") != "COST":
                    continue
                limit = b.get("BudgetLimit") or {}
                found.append(BudgetFact(name=str(b.get("BudgetName", "?")),
                                        limit_usd=_float(limit.get("Amount")) if limit.get("Unit") == "USD" else None,
                                        time_unit=_str(b.get("TimeUnit"))))
        return found

    def create_budget(self, name: str, usd: float, email: str) -> None:
        budget, notifications = budget_documents(name, usd, email)
        self._call("global", "budgets", "us-east-1", "create_budget", "budgets:ModifyBudget", AccountId=self.account,
                   Budget=budget, NotificationsWithSubscribers=notifications)

    def bucket_region(self, bucket: str) -> tuple[Text, float | None]:
        def ask() -> Text:
            answer = self._call("global", "s3", self.session.region_name or "us-east-1", "get_bucket_location",
                                "s3:GetBucketLocation", Bucket=bucket)
            # "Buckets in Region us-east-1 have a LocationConstraint of null" (S3 API Reference, GetBucketLocation)
            return Text(value=answer.get("LocationConstraint") or "us-east-1")
        return self._cached("global", ["bucket_region", bucket], Text, ask, "s3:GetBucketLocation")

    def bucket_size(self, bucket: str, prefix: str) -> tuple[BucketSize, float | None]:
        def ask() -> BucketSize:
            total = count = 0
            for page in self._pages("global", "s3", self.session.region_name or "us-east-1", "list_objects_v2",
                                    "s3:ListBucket", BUCKET_LIST_MAX_OBJECTS, Bucket=bucket, Prefix=prefix):
                for o in page.get("Contents", []):
                    total += _int(o.get("Size")) or 0
                    count += 1
            return BucketSize(bytes=total, objects=count, complete=count < BUCKET_LIST_MAX_OBJECTS)
        return self._cached("global", ["bucket_size", bucket, prefix], BucketSize, ask, "s3:ListBucket")


def budget_documents(name: str, usd: float, email: str) -> tuple[dict, list[dict]]:
    """The CreateBudget documents: a monthly cost budget with e-mail alerts at 50, 80 and 100% of actual spend."""
    budget = {"BudgetName": name, "BudgetLimit": {"Amount": f"{usd:.2f}", "Unit": "USD"}, "TimeUnit": "MONTHLY",
              "BudgetType": "COST"}
    notifications = [{"Notification": {"NotificationType": "ACTUAL", "ComparisonOperator": "GREATER_THAN",
                                       "Threshold": float(pct), "ThresholdType": "PERCENTAGE"},
                      "Subscribers": [{"SubscriptionType": "EMAIL", "Address": email}]} for pct in (50, 80, 100)]
    return budget, notifications


def spot_stats(records: list[tuple[str, float, dt.datetime]], start: dt.datetime, now: dt.datetime) -> SpotStats:
    """Latest price per AZ; min, max and time-weighted median over [start, now] (a record's price holds
    until the next record of its AZ)."""
    by_az: dict[str, list[tuple[dt.datetime, float]]] = {}
    for az, price, ts in records:
        by_az.setdefault(az, []).append((ts, price))
    latest: dict[str, float] = {}
    weighted: list[tuple[float, float]] = []
    for az, series in by_az.items():
        series.sort()
        latest[az] = series[-1][1]
        for i, (ts, price) in enumerate(series):
            until = series[i + 1][0] if i + 1 < len(series) else now
            seconds = (min(until, now) - max(ts, start)).total_seconds()
            weighted.append((price, max(0.0, seconds)))
    if not weighted:
        return SpotStats(by_az={}, min=None, median=None, max=None, records=0)
    total = sum(w for _, w in weighted)
    median = None
    if total > 0:
        acc = 0.0
        for price, w in sorted(weighted):
            acc += w
            if acc >= total / 2:
                median = price
                break
    else:
        prices = sorted(p for p, _ in weighted)
        median = prices[len(prices) // 2]
    counted = [p for p, w in weighted if w > 0] or [p for p, _ in weighted]
    return SpotStats(by_az=dict(sorted(latest.items())), min=min(counted), median=median, max=max(counted),
                     records=len(records))


def _price_of(item: Any) -> tuple[float | None, str | None]:
    """The on-demand $/hour of one Price List product (a JSON string), every field checked."""
    try:
        doc = parse_json(item) if isinstance(item, str) else item
        terms = doc["terms"]["OnDemand"]
        for term in terms.values():
            for dim in term["priceDimensions"].values():
                if str(dim.get("unit", "")).lower() in ("hrs", "hours"):
                    return _float(dim["pricePerUnit"]["USD"]), _str(doc.get("publicationDate"))
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return None, None


def _is_boto(exc: BaseException) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    return isinstance(exc, (BotoCoreError, ClientError))


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if x == x and x not in (float("inf"), float("-inf")) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _iso(value: dt.datetime) -> str:
    return value.astimezone(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
