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


class Readiness(BaseModel):
    """How much of the readiness decision the evidence covers (docs/check.md, "The verdict")."""

    status: Literal["ready", "not-ready", "not-verified"] = Field(
        description="not-ready: a check failed; not-verified: a check that decides readiness had no evidence.")
    text: str = Field(description="One line for people: what was decided and on what.")
    verified: list[str] = Field([], description="Deciding checks judged on full evidence.")
    partial: list[str] = Field([], description="Deciding checks judged on evidence that was cut short or elided.")
    unverified: list[str] = Field([], description="Deciding checks without evidence, each 'id: why'.")
    not_applicable: list[str] = Field([], description="Deciding checks that do not apply to this node.")


class CheckReport(BaseModel):
    """What `trainready check --json` prints. Schema: docs/schemas/check.schema.json."""

    schema_version: int = 2
    instance_type: str | None = Field(None, description="Known or detected instance type; None if unknown.")
    source: str = Field(description="'live' or the bundle directory analyzed.")
    readiness: Readiness | None = Field(None, description="The verdict; None for a report of single files only.")
    checks: list[Finding]
    summary: dict[str, int]

    @classmethod
    def build(cls, instance_type: str | None, source: str, findings: list[Finding],
              readiness: Readiness | None = None) -> CheckReport:
        ordered = sorted(findings, key=lambda f: (SEVERITY[f.status], f.area, f.id))
        summary = {status: sum(f.status == status for f in findings) for status in ("pass", "warn", "fail", "skip")}
        return cls(instance_type=instance_type, source=source, checks=ordered, summary=summary, readiness=readiness)

    def adding(self, *findings: Finding) -> CheckReport:
        """This report with more findings (--fix, --dataset); a failure among them makes it not ready."""
        readiness = self.readiness
        failed = [f.id for f in findings if f.status == "fail"]
        if readiness is not None and failed:
            readiness = readiness.model_copy(update={"status": "not-ready",
                                                     "text": f"not ready: {', '.join(failed)} failed; " + readiness.text})
        return CheckReport.build(self.instance_type, self.source, [*self.checks, *findings], readiness)

    @property
    def failed(self) -> bool:
        return self.summary.get("fail", 0) > 0

    @property
    def exit_code(self) -> int:
        """0 ready, 1 a check failed or the decision is not verified (docs/check.md, Exit codes)."""
        if self.failed:
            return 1
        return 1 if self.readiness is not None and self.readiness.status == "not-verified" else 0


def skip(check_id: str, area: str, reason: str, advice: str = "") -> Finding:
    return Finding(id=check_id, area=area, status="skip", reason=reason, advice=advice)
