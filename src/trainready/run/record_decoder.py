"""The one decoder of what a run directory holds, built from the documented models (records.py): telemetry records
and run.json's launches are checked against those models' types and bounds, as written by this version, an older
one, or an attacker.

Tolerant where it can be: fields a model does not know are kept (a newer writer), absent ones stay absent (an
older writer), and a field with a bad value (a wrong type, NaN, negative or huge) becomes unknown (None, or the
model's READ_FALLBACK), counted. A record whose READ_CORE field is bad, or whose READ_NEEDED field is absent, is
left out, counted: "<type>: <field> <why>". Decoded records stay dicts (the readers index them), but every field
the models name is of its documented type and within its bounds, or absent."""

from __future__ import annotations

import functools
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo

from .records import (BudgetRecord, CkptDroppedRecord, CkptRecord, EndRecord, ExitRecord, IntervalRecord, Launch,
                      LaunchRecord, RestoreRecord, StartRecord, StepRecord, StopRecord, _Record)

RECORD_MODELS: dict[str, type[BaseModel]] = {
    model.model_fields["type"].annotation.__args__[0]: model  # the Literal of its `type`
    for model in (LaunchRecord, StartRecord, RestoreRecord, StepRecord, CkptRecord, IntervalRecord, BudgetRecord,
                  CkptDroppedRecord, StopRecord, EndRecord, ExitRecord)
}
_NOT_READ = frozenset({"type", "schema_version", "source"})
"""The discriminator, the version (a newer writer's stays readable) and who wrote it: not data."""


class BadRecord(Exception):
    """A record (or launch) left out: why."""


def decode_records(raw: list[Any], skipped: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The usable records of `raw` (parsed telemetry lines), each decoded; what was left out or made unknown is
    counted in `skipped` by reason (a plain dict or a Counter, added to)."""
    skipped = skipped if skipped is not None else {}
    out = []
    for record in raw:
        try:
            out.append(decode_record(record, skipped))
        except BadRecord as exc:
            kind = record.get("type") if isinstance(record, dict) else None
            _count(skipped, f"{kind if isinstance(kind, str) else '?'}: {exc}")
    return out


def decode_record(record: Any, skipped: dict[str, int]) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise BadRecord("not an object")
    kind = record.get("type")
    if not isinstance(kind, str):
        raise BadRecord("type not a string")
    return _decode(RECORD_MODELS.get(kind, _Record), record, skipped, f"{kind} field")


def decode_launches(launches: Any, skipped: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """run.json's launches that can be used (their start and end are times, the end not before the start), each
    decoded; the others are counted in `skipped` as "launch: <why>" (anything but a list: none)."""
    skipped = skipped if skipped is not None else {}
    out = []
    for launch in launches if isinstance(launches, list) else []:
        try:
            if not isinstance(launch, dict):
                raise BadRecord("not an object")
            launch = _decode(Launch, launch, skipped, "launch field")
            end = launch.get("end_unix")
            if end is not None and end < launch["start_unix"]:
                raise BadRecord("ends before it starts")
            out.append(launch)
        except BadRecord as exc:
            _count(skipped, f"launch: {exc}")
    return out


def _count(skipped: dict[str, int], why: str) -> None:
    skipped[why] = skipped.get(why, 0) + 1


def _decode(model: type[BaseModel], record: dict[str, Any], skipped: dict[str, int], label: str) -> dict[str, Any]:
    for name in model.READ_NEEDED:
        if name not in record:
            raise BadRecord(f"{name} missing")
    try:
        _reader(model).model_validate(record)
        return record
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    out = dict(record)
    for name, problem in _first_error_per_field(errors).items():
        if name in model.READ_CORE:
            raise BadRecord(problem)
        fallback = model.READ_FALLBACK.get(name)
        out[name] = fallback.copy() if isinstance(fallback, (dict, list)) else fallback
        _count(skipped, f"{label}: {problem}")
    return out


def _first_error_per_field(errors: list[dict[str, Any]]) -> dict[str, str]:
    """{top-level field: "<path> <why>"} of its first error; the path names nested fields (metrics.nonfinite), not
    list positions."""
    found: dict[str, str] = {}
    for error in errors:
        loc = error["loc"] or ("?",)
        path = ".".join(str(part) for part in loc if isinstance(part, str))
        found.setdefault(str(loc[0]), f"{path} {_why(error)}")
    return found


def _why(error: dict[str, Any]) -> str:
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind in ("greater_than_equal", "greater_than"):
        low = ctx.get("ge", ctx.get("gt"))
        return "negative" if low == 0 else f"below {low:g}"
    if kind in ("less_than_equal", "less_than"):
        return "too large"
    if kind == "finite_number":
        return "not finite"
    if kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        return "too large" if value > 0 else "negative"  # an integer past a float's range (10**400)
    return _WHY.get(kind, "malformed")


_WHY = {"float_type": "not a number", "int_type": "not an integer", "string_type": "not a string",
        "bool_type": "not true or false", "list_type": "not a list", "dict_type": "not an object",
        "model_type": "not an object", "model_attributes_type": "not an object", "literal_error": "not a known value",
        "extra_forbidden": "has an unknown field", "missing": "missing a field"}


@functools.cache
def _reader(model: type[BaseModel]) -> type[BaseModel]:
    """The model as a reader: the same types and bounds checked strictly (no "5" for 5, no true for 1, no NaN),
    every field optional (an older writer wrote fewer), unknown ones ignored; nested models likewise."""
    fields = {name: (_lenient(info.annotation), FieldInfo.merge_field_infos(info, default=None))
              for name, info in model.model_fields.items() if name not in _NOT_READ}
    config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")
    return create_model(f"{model.__name__}Reader", __config__=config, **fields)


def _lenient(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _reader(annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return list[_reader(args[0])]
    return annotation
