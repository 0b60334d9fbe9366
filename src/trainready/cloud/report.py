"""`trainready account --json`: what the cloud account says about launching an instance type x nodes,
per region. Every line carries a status and a reason:

- ok: checked and fine;
- warn: works, but something deserves attention (no budget alarm, low spot placement score);
- fail: blocks the job in that region (quota short, type not offered, RunInstances denied);
- unknown: could not be checked (a call denied, unsupported, throttled past botocore's retries or
  unreachable): the reason names the missing permission or the error, and the other lines go on.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["ok", "warn", "fail", "unknown"]
ACCOUNT_SCHEMA_VERSION = 1
_ORDER = {"ok": 0, "unknown": 1, "warn": 2, "fail": 3}


def worst(statuses: list[Status] | tuple[Status, ...]) -> Status:
    """The status of a group of lines: fail over warn over unknown over ok."""
    return max(statuses, key=_ORDER.__getitem__, default="ok")


class Identity(BaseModel):
    account: str | None
    arn: str | None
    status: Status
    reason: str


class QuotaLine(BaseModel):
    code: str = Field(description="Service Quotas code, e.g. L-417A185B")
    name: str
    purchase: Literal["on-demand", "spot"]
    limit_vcpus: float | None
    used_vcpus: float | None = Field(description="current usage (CloudWatch AWS/Usage) where the API gives it")
    needed_vcpus: int = Field(description="vCPUs per instance x nodes")
    headroom_vcpus: float | None = Field(description="limit - used (- nothing when usage is unknown)")
    request_vcpus: int | None = Field(None, description="the value to ask for when the quota is short")
    request_command: str | None = Field(None, description="the exact AWS CLI command that asks for it")
    status: Status
    reason: str


class Offerings(BaseModel):
    azs: list[str]
    efa: bool | None
    network_cards: int | None
    efa_interfaces: int | None = Field(None, description="most EFA interfaces one instance takes")
    vcpus: int | None = Field(None, description="default vCPUs per instance (DescribeInstanceTypes)")
    status: Status
    reason: str


class Permission(BaseModel):
    action: str = Field(description="IAM action, e.g. ec2:RunInstances")
    status: Status
    reason: str


class SpotInfo(BaseModel):
    price_now_usd_per_hour: float | None = Field(description="the cheapest AZ's latest spot price")
    by_az: dict[str, float] = Field(description="latest spot price per AZ")
    min: float | None = Field(description="over the last 7 days, all AZs")
    median: float | None = Field(description="time-weighted over the last 7 days, all AZs")
    max: float | None
    records: int = Field(description="price changes the 7 days hold")
    placement_score: int | None = Field(description="1-10 for the node count in one AZ (GetSpotPlacementScores)")
    placement_az_id: str | None = None
    status: Status
    reason: str


class CapacityBlock(BaseModel):
    # also the cached answer (cloud/cache.py): every field, none extra, finite numbers, as the _Fact models
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    start: str
    end: str
    instance_count: int
    upfront_fee_usd: float | None
    availability_zone: str | None
    duration_hours: int | None
    usd_per_instance_hour: float | None


class Reservation(BaseModel):
    # also the cached answer (cloud/cache.py): every field, none extra, finite numbers, as the _Fact models
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    id: str
    availability_zone: str | None
    total: int
    available: int
    state: str
    end: str | None


class Line(BaseModel):
    status: Status
    reason: str


class RegionReport(BaseModel):
    region: str
    status: Status = Field(description="worst line of the region")
    quotas: list[QuotaLine]
    offerings: Offerings
    permissions: list[Permission]
    spot: SpotInfo
    capacity_blocks: list[CapacityBlock] = Field(description="cheapest offerings for the node count and duration")
    capacity_reservations: list[Reservation]
    capacity: Line = Field(description="status of the Capacity Block and reservation lookups")


class Budget(BaseModel):
    present: bool | None
    name: str | None
    limit_usd: float | None
    created: bool = False
    command: str | None = Field(None, description="the AWS CLI command that creates one, when there is none")
    status: Status
    reason: str


class QuotaRequest(BaseModel):
    region: str
    code: str
    desired_vcpus: int
    request_id: str | None
    state: str | None
    status: Status
    reason: str


class CacheInfo(BaseModel):
    directory: str
    max_age_s: float
    hits: int
    misses: int
    notes: list[str]


class AccountReport(BaseModel):
    """`trainready account --json`"""

    schema_version: int = ACCOUNT_SCHEMA_VERSION
    provider: Literal["aws"] = "aws"
    instance: str
    nodes: int
    purchase: Literal["on-demand", "spot"]
    vcpus_per_instance: int | None
    vcpus_needed: int | None
    hours: float | None = Field(description="how long the job runs (Capacity Block duration), if known")
    identity: Identity
    regions: list[RegionReport]
    budget: Budget
    permissions: list[Permission] = Field(description="account-wide: archive bucket, budgets")
    quota_requests: list[QuotaRequest] = Field(description="filed with --request-quota")
    usable_regions: list[str] = Field(description="regions with no failing line where something about launching was answered (a quota, the offerings, spot, capacity or the RunInstances dry run)")
    status: Status
    reason: str
    checked_at: str = Field(description="UTC, ISO 8601")
    seconds: float
    cache: CacheInfo
    notes: list[str]
