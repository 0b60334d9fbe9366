"""Calibration files: the factors a fit found, what they apply to, and where they came from.

JSON (schema: docs/schemas/calibration.schema.json), one file per name under the user's config
directory ($XDG_CONFIG_HOME/trainready/calibrations, else ~/.config/trainready/calibrations), or
anywhere as a path. Read as hostile: size-limited, every field typed and checked (no unknown
fields, no NaN), every factor named and inside its bounds, a factor the data did not inform
exactly at its prior, and the GPU, instance and stack known to this trainready.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainready.catalog import Catalog
from trainready.catalog.textfile import read_user_text
from trainready.errors import UsageError, closest, printable
from trainready.io import parse_json, xdg_dir

from . import efficiency as eff
from .calibration import FACTORS, Fit, Residual, calibrated_efficiency, mean_abs_error
from .setup import Setup
from .stacks import STACKS

CALIBRATION_SCHEMA_VERSION = 1
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
FILE_LIMIT = 1 << 20  # a calibration is a few KiB
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class CalibratedFactor(BaseModel):
    model_config = _STRICT
    value: float = Field(description="the factor used from now on (fraction; bounds in plan/calibration.py FACTORS)")
    prior: float = Field(description="efficiency.py's value before the fit")
    status: Literal["informed", "partly informed", "not informed"] = Field(
        description="informed: the data pin it; partly: it moved with factors the data cannot tell apart; "
                    "not informed: kept at the prior")
    uncertainty: float = Field(ge=0, le=10, description="posterior sd of log(value), about the relative uncertainty")
    informed_by: list[str] = Field(default_factory=list, max_length=3,
                                   description="the measurements that move it most")


class MeasuredFigure(BaseModel):
    model_config = _STRICT
    label: str = Field(max_length=300)
    kind: str = Field(max_length=40, description="step, tokens_per_s, compute, communication, optimizer, "
                                                 "peak_memory, gemm_tflops, busbw, hbm_copy")
    measured: float = Field(ge=0, description="seconds (step parts), tokens/s, GiB, TFLOP/s or GB/s (busbw)")
    predicted_before: float = Field(ge=0)
    predicted_after: float = Field(ge=0)


class CalibrationSource(BaseModel):
    model_config = _STRICT
    kind: Literal["run", "bundle", "measurements"]
    path: str = Field(max_length=4096)
    what: list[str] = Field(default_factory=list, max_length=64, description="what it measured, in words")


class FitSummary(BaseModel):
    model_config = _STRICT
    method: str = Field(max_length=200)
    step_error_before: float | None = Field(None, ge=0, description="mean |predicted/measured - 1| of the steps")
    step_error_after: float | None = Field(None, ge=0)
    error_before: float | None = Field(None, ge=0, description="mean |predicted/measured - 1| of every figure")
    error_after: float | None = Field(None, ge=0)
    figures: list[MeasuredFigure] = Field(default_factory=list, max_length=1000)
    notes: list[str] = Field(default_factory=list, max_length=20)


class CalibrationFile(BaseModel):
    """A named calibration: `estimate|plan --calibrate` writes it, `--calibration NAME|FILE` reads it."""

    model_config = _STRICT
    schema_version: Literal[1] = CALIBRATION_SCHEMA_VERSION
    kind: Literal["trainready-calibration"] = "trainready-calibration"
    name: str = Field(pattern=NAME_PATTERN, description="lowercase letters, digits, '.', '_', '-'; 64 at most")
    created: str = Field(max_length=40, description="when it was fitted, ISO 8601 with a time zone")
    gpu: str = Field(max_length=64, description="the catalog's GPU name: the calibration applies to this GPU only")
    instance: str | None = Field(None, max_length=64, description="the instance measured; the inter-node factor "
                                                                  "applies to this instance type only")
    stack: str | None = Field(None, max_length=64, description="the stack the runs used (None: check --deep alone, "
                                                               "any stack)")
    factors: dict[str, CalibratedFactor] = Field(description="every factor of plan/calibration.py FACTORS")
    sources: list[CalibrationSource] = Field(min_length=1, max_length=32)
    fit: FitSummary

    @field_validator("created")
    @classmethod
    def _iso(cls, v: str) -> str:
        try:
            when = datetime.fromisoformat(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an ISO 8601 date and time") from None
        if when.tzinfo is None:
            raise ValueError(f"{v!r} has no time zone (write it as 2026-12-02T10:00:00+00:00)")
        return v

    @model_validator(mode="after")
    def _factors(self) -> CalibrationFile:
        names = set(self.factors)
        if names != set(FACTORS):
            unknown, missing = sorted(names - set(FACTORS)), sorted(set(FACTORS) - names)
            parts = ([f"unknown factor(s) {', '.join(map(repr, unknown))}"] if unknown else []) + (
                [f"missing {', '.join(missing)}"] if missing else [])
            raise ValueError(f"{'; '.join(parts)}; the factors are: {', '.join(FACTORS)}")
        for name, f in self.factors.items():
            spec = FACTORS[name]
            for what, v in (("value", f.value), ("prior", f.prior)):
                if not spec.lower <= v <= spec.upper:
                    raise ValueError(f"factor {name} {what} {v:g} is outside its bounds {spec.lower:g}..{spec.upper:g}")
            if f.status == "not informed" and f.value != f.prior:
                raise ValueError(f"factor {name} is 'not informed' but its value {f.value:g} differs from its prior "
                                 f"{f.prior:g}: a factor the data did not inform keeps its prior")
        return self

    def calibrated(self) -> dict[str, float]:
        """The factors the data moved."""
        return {n: f.value for n, f in self.factors.items() if f.status != "not informed"}

    def describe(self) -> str:
        """One line: which factors came from this calibration."""
        fitted = [f"{n} {f.value:.3g}" for n, f in self.factors.items() if f.status == "informed"]
        partly = [f"{n} {f.value:.3g}" for n, f in self.factors.items() if f.status == "partly informed"]
        text = f"calibration '{self.name}' ({self.created[:10]}, {self.gpu}"
        text += f", {self.stack}" if self.stack else ""
        text += "): " + (", ".join(fitted) + " fitted" if fitted else "no factor pinned")
        if partly:
            text += f"; {', '.join(partly)} moved together (partly informed)"
        kept = [n for n, f in self.factors.items() if f.status == "not informed"]
        if kept:
            text += f"; {', '.join(kept)} as efficiency.py"
        return text


# --- making one ----------------------------------------------------------------------------------
def from_fit(name: str, result: Fit, *, gpu: str, instance: str | None, stack: str | None,
             sources: list[CalibrationSource], now: datetime | None = None) -> CalibrationFile:
    valid_name(name)
    after = {r.label: r for r in result.after}

    def figure(r: Residual) -> MeasuredFigure:
        (before, measured), (later, _) = r.natural(), after.get(r.label, r).natural()
        return MeasuredFigure(label=r.label[:300], kind=r.kind, measured=measured, predicted_before=before,
                              predicted_after=later)

    factors = {n: CalibratedFactor(value=f.value, prior=f.prior, status=f.status, uncertainty=round(f.sd, 4),
                                   informed_by=[x[:300] for x in f.informed_by]) for n, f in result.factors.items()}
    return CalibrationFile(
        name=name, created=(now or datetime.now(timezone.utc)).isoformat(timespec="seconds"), gpu=gpu,
        instance=instance, stack=stack, factors=factors, sources=sources,
        fit=FitSummary(method="MAP, bounded Levenberg-Marquardt in log space (plan/calibration.py)",
                       step_error_before=mean_abs_error(result.before), step_error_after=mean_abs_error(result.after),
                       error_before=mean_abs_error(result.before, None), error_after=mean_abs_error(result.after, None),
                       figures=[figure(r) for r in result.before][:1000], notes=result.notes[:20]))


def default_name(gpu: str, stack: str | None) -> str:
    raw = f"{gpu}-{stack}" if stack else gpu
    return re.sub(r"[^a-z0-9._-]", "-", raw.lower())[:64].lstrip("._-") or "calibration"


# --- using one -------------------------------------------------------------------------------------
def check_known(cal: CalibrationFile, catalog: Catalog, shown: str) -> None:
    """The GPU, instance and stack must be ones this trainready knows."""
    try:
        gpu = catalog.gpu(cal.gpu)
        if cal.instance is not None:
            inst = catalog.instance(cal.instance)
            if inst.gpu != gpu.name:
                raise UsageError(f"instance {inst.name} has {inst.gpu}, not {gpu.name}")
    except UsageError as exc:
        raise UsageError(f"calibration {shown}: {exc}") from None
    if cal.stack is not None and cal.stack not in STACKS:
        near = closest(cal.stack, STACKS)
        raise UsageError(f"calibration {shown}: unknown stack '{printable(cal.stack)}'"
                         f"{f' (did you mean {near[0]}?)' if near else ''}; known: {', '.join(STACKS)}")


def check_applies(cal: CalibrationFile, gpu: str, stack: str) -> None:
    """For `estimate`: a calibration is for one GPU and, when runs made it, one stack."""
    if cal.gpu != gpu:
        raise UsageError(f"calibration '{cal.name}' is for {cal.gpu}; this estimate runs on {gpu}: "
                         f"calibrate on {gpu} (trainready estimate ... --calibrate RUN_DIR) or drop --calibration")
    check_stack(cal, stack)


def check_stack(cal: CalibrationFile, stack: str) -> None:
    if cal.stack is not None and cal.stack != stack:
        raise UsageError(f"calibration '{cal.name}' was fitted on stack {cal.stack}; this job uses {stack}: "
                         f"give --stack {cal.stack}, or calibrate on a run of {stack}")


def efficiency_for(cal: CalibrationFile, s: Setup) -> eff.ArchEfficiency | None:
    """`s`'s factors with the calibration applied (None: another GPU). The inter-node factor is the
    measured instance's network: on another instance type it stays efficiency.py's."""
    if s.gpu.name != cal.gpu:
        return None
    values = cal.calibrated()
    text = cal.describe()
    if cal.instance and "inter_node" in values and (s.instance is None or s.instance.name != cal.instance):
        values.pop("inter_node")
        text += f"; inter_node kept (measured on {cal.instance})"
    return calibrated_efficiency(s.efficiency or eff.arch_efficiency(s.gpu.arch), values, text)


# --- files ------------------------------------------------------------------------------------------
def valid_name(name: str) -> str:
    if not re.fullmatch(NAME_PATTERN, name):
        raise UsageError(f"calibration name '{printable(name)}' is not valid: lowercase letters, digits, '.', '_' "
                         f"and '-', starting with a letter or digit, 64 at most (e.g. h200-hf-trainer)")
    return name


def calibration_dir() -> Path:
    return xdg_dir("XDG_CONFIG_HOME", ".config", "calibrations") / "calibrations"


def stored_names() -> list[str]:
    try:
        return sorted(p.stem for p in calibration_dir().glob("*.json") if re.fullmatch(NAME_PATTERN, p.stem))
    except OSError:
        return []


def is_path(ref: str) -> bool:
    return "/" in ref or ref.endswith(".json") or ref.startswith(".")


def locate(ref: str) -> Path:
    """A stored calibration's file, or `ref` itself when it is a path."""
    if is_path(ref):
        return Path(ref)
    valid_name(ref)
    path = calibration_dir() / f"{ref}.json"
    if not path.exists():
        names = stored_names()
        near = closest(ref, names)
        hint = f" Did you mean {', '.join(near)}?" if near else ""
        have = f"stored: {', '.join(names)}" if names else f"none stored yet in {calibration_dir()}"
        raise UsageError(f"no calibration named '{ref}'.{hint} ({have}; make one with "
                         f"`trainready estimate ... --calibrate RUN_DIR`)")
    return path


def parse(text: str, shown: str) -> CalibrationFile:
    try:
        data = parse_json(text)
    except ValueError as exc:
        raise UsageError(f"calibration {shown} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"calibration {shown} is not a JSON object")
    version = data.get("schema_version")
    if version != CALIBRATION_SCHEMA_VERSION:
        raise UsageError(f"calibration {shown}: schema_version {printable(repr(version))} is not supported; this "
                         f"trainready reads {CALIBRATION_SCHEMA_VERSION} (`--calibrate` writes it)")
    if data.get("kind") != "trainready-calibration":
        raise UsageError(f"calibration {shown}: kind {printable(repr(data.get('kind')))} is not "
                         f"\"trainready-calibration\"")
    try:
        return CalibrationFile.model_validate_json(text)
    except ValidationError as exc:
        lines = [f"calibration {shown}: field '{'.'.join(str(x) for x in e['loc']) or '(top)'}': "
                 f"{printable(e['msg'])}" for e in exc.errors()[:10]]
        raise UsageError("\n".join(lines)) from None


def load(ref: str, catalog: Catalog) -> CalibrationFile:
    path = locate(ref)
    shown = printable(ref if is_path(ref) else f"'{ref}' ({path})")
    cal = parse(read_user_text(path, "calibration file", limit=FILE_LIMIT), shown)
    check_known(cal, catalog, shown)
    return cal


def save(cal: CalibrationFile, path: Path | None = None) -> Path:
    from trainready.io import make_dir, replace_durable

    path = path or calibration_dir() / f"{valid_name(cal.name)}.json"
    make_dir(path.parent)
    replace_durable(path, (cal.model_dump_json(indent=1) + "\n").encode())
    return path
