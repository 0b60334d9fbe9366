"""EC2 vCPU quota codes, Capacity Block rules and inter-region transfer prices (data/aws_quotas.toml),
behind a typed loader: which Service Quotas code limits an instance type for a purchase option."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainready.errors import UsageError

Purchase = Literal["on-demand", "spot"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class QuotaCode(_Strict):
    code: str = Field(pattern=r"^L-[0-9A-F]{8}$")
    name: str = Field(min_length=1)
    purchase: Purchase
    prefixes: list[str] = Field(min_length=1)
    source: str = Field(min_length=1)
    uncertain: str | None = None


class CapacityBlockRules(_Strict):
    instance_types: list[str]
    instance_counts: list[int] = Field(min_length=1)
    day_steps_until_days: int = Field(ge=1)
    week_steps_until_days: int = Field(ge=1)
    source: str = Field(min_length=1)

    def duration_hours(self, hours: float) -> int | None:
        """The shortest duration a Capacity Block can be bought for that covers `hours` (whole days up
        to `day_steps_until_days`, then whole weeks), or None when no block is that long."""
        days = max(1, -(-hours // 24))
        if days > self.day_steps_until_days:
            days = -(-days // 7) * 7
        return None if days > self.week_steps_until_days else int(days * 24)

    def instance_count(self, nodes: int) -> int | None:
        """The smallest block size that holds `nodes` instances, or None."""
        return next((n for n in sorted(self.instance_counts) if n >= nodes), None)


class Transfer(_Strict):
    inter_region_usd_per_gb: float = Field(gt=0)
    source: str = Field(min_length=1)
    cross_region_gbps_per_node: float = Field(gt=0)
    cross_region_gbps_note: str = Field(min_length=1)


class AwsLimits(_Strict):
    schema_version: Literal[1]
    quota: list[QuotaCode]
    capacity_blocks: CapacityBlockRules
    transfer: Transfer

    @model_validator(mode="after")
    def _unique(self) -> "AwsLimits":
        seen: set[tuple[str, str]] = set()
        for q in self.quota:
            for p in q.prefixes:
                if (q.purchase, p) in seen:
                    raise ValueError(f"prefix {p!r} is listed twice for {q.purchase}")
                seen.add((q.purchase, p))
        return self

    def quota_for(self, instance_type: str, purchase: Purchase) -> QuotaCode | None:
        """The quota that counts `instance_type` for `purchase`, by the longest matching family prefix."""
        family = instance_type.split(".", 1)[0].lower()
        best: tuple[int, QuotaCode] | None = None
        for q in self.quota:
            if q.purchase != purchase:
                continue
            for p in q.prefixes:
                if family.startswith(p) and (best is None or len(p) > best[0]):
                    best = (len(p), q)
        return best[1] if best else None


@functools.lru_cache(maxsize=1)
def aws_limits() -> AwsLimits:
    from .loader import read_toml

    text = (resources.files("trainready.catalog") / "data" / "aws_quotas.toml").read_text()
    try:
        return AwsLimits.model_validate(read_toml(text, "<builtin>/aws_quotas.toml"))
    except ValidationError as exc:  # a broken built-in file is a bug, said plainly
        raise UsageError(f"<builtin>/aws_quotas.toml: {exc}") from None
