"""One shape for every check (after gpud and NVIDIA's health checks): an id, an area, a status,
what was observed, what was expected, why this status, and one concrete line of advice."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Status = Literal["pass", "warn", "fail", "skip"]
SEVERITY = {"fail": 0, "warn": 1, "pass": 2, "skip": 3}


class Finding(BaseModel):
    id: str = Field(description="Stable check id, e.g. gpu.nvlink-topology.")
    area: str = Field(description="gpu, nvswitch, pci, net, cpu, mem, storage, cuda, nccl, data.")
    status: Status
    observed: str = ""
    expected: str = ""
    reason: str = Field("", description="Why this status (for skip: why the check could not run).")
    advice: str = Field("", description="One concrete line: what to do.")


class CheckReport(BaseModel):
    """What `trainready check --json` prints. Schema: docs/schemas/check.schema.json."""

    schema_version: int = 1
    instance_type: str | None = Field(None, description="Known or detected instance type; None if unknown.")
    source: str = Field(description="'live' or the bundle directory analyzed.")
    checks: list[Finding]
    summary: dict[str, int]

    @classmethod
    def build(cls, instance_type: str | None, source: str, findings: list[Finding]) -> CheckReport:
        ordered = sorted(findings, key=lambda f: (SEVERITY[f.status], f.area, f.id))
        summary = {status: sum(f.status == status for f in findings) for status in ("pass", "warn", "fail", "skip")}
        return cls(instance_type=instance_type, source=source, checks=ordered, summary=summary)

    @property
    def failed(self) -> bool:
        return self.summary.get("fail", 0) > 0


def skip(check_id: str, area: str, reason: str, advice: str = "") -> Finding:
    return Finding(id=check_id, area=area, status="skip", reason=reason, advice=advice)
