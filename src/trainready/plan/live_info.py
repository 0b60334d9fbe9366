"""What `plan --live` adds to a plan (filled by trainready.cloud.live; the plan itself never asks a
cloud): per row, whether it can launch now and at what price; for the plan, where the facts came
from. Without credentials or network every row keeps the catalog's price and says so."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class CapacityBlockOffer(BaseModel):
    start: str
    end: str
    instance_count: int
    duration_hours: int | None
    upfront_fee_usd: float | None
    availability_zone: str | None


class LiveRow(BaseModel):
    attainable: bool | None = Field(description="true: can launch now in `region`; false: blocked everywhere asked; "
                                                "null: not known (no credentials, a check denied, another cloud)")
    reasons: list[str] = Field(description="what blocks it or could not be checked, per region")
    price_source: Literal["live", "catalog"]
    price_as_of: str | None
    region: str | None = Field(description="where the row is priced: the cheapest region where it can launch")
    usd_per_hour: float | None = Field(description="per node, at price_source")
    total_usd: float | None = Field(description="expected cost at this price (for --tokens, else per 1B tokens), "
                                                "data transfer included")
    worst_case_usd: float | None = Field(description="the same at the 90th percentile of interruptions, restarts "
                                                     "and rework (never below the expected)")
    worst_case_hours: float | None
    quota_code: str | None = None
    quota_headroom_vcpus: float | None
    azs: list[str]
    spot_score: int | None = Field(description="spot placement score 1-10 for the node count in one AZ")
    capacity_block: CapacityBlockOffer | None = Field(description="the cheapest Capacity Block for the nodes and hours")
    transfer_gb: float | None = Field(None, description="data that crosses regions: dataset once, checkpoints uploaded")
    transfer_usd: float | None = None
    transfer_hours: float | None = None


class DataLocation(BaseModel):
    url: str
    region: str | None
    bytes: int | None
    objects: int | None


class LivePlan(BaseModel):
    provider: str
    live: bool = Field(description="false: the account could not be asked and the catalog answered")
    reason: str = Field(description="one line: where the figures come from, or why the catalog answered")
    regions: list[str]
    checked_at: str | None
    seconds: float | None = Field(description="time spent asking the cloud")
    data: DataLocation | None
    notes: list[str]
