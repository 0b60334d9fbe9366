"""Load the built-in catalog, merge a user's file, and look names up.

Nothing is read at import time; `load_catalog()` caches the built-in data per process.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainready.errors import UnknownNameError, UsageError, closest, did_you_mean, normalize_name, printable

from .prices import flag_suspect_prices
from .schema import Gpu, Instance
from .textfile import read_user_text

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Catalog:
    """GPUs and instance types by canonical name, plus an alias index for GPUs."""

    gpus: dict[str, Gpu]
    instances: dict[str, Instance]
    files: tuple[str, ...] = ()
    _gpu_keys: dict[str, str] = field(default_factory=dict, repr=False)
    _instance_keys: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.instances.update({name: flag_suspect_prices(i) for name, i in self.instances.items()})
        self._gpu_keys.update(_gpu_aliases(self.gpus))
        for inst in self.instances.values():
            self._instance_keys[normalize_name(inst.name)] = inst.name

    def __repr__(self) -> str:
        return f"Catalog({len(self.gpus)} GPUs, {len(self.instances)} instance types)"

    def gpu(self, name: str) -> Gpu:
        key = self._gpu_keys.get(normalize_name(name))
        if key is None:
            raise UnknownNameError("GPU", name, self.gpus, "See `trainready catalog gpus`.")
        return self.gpus[key]

    def instance(self, name: str) -> Instance:
        key = self._instance_keys.get(normalize_name(name))
        if key is None:
            raise UnknownNameError("instance type", name, self.instances,
                                   "See `trainready catalog instances`.")
        return self.instances[key]

    def gpu_of(self, inst: Instance) -> Gpu:
        return self.gpus[inst.gpu]

    @property
    def regions(self) -> list[str]:
        """Every region the catalog names: where an instance has a price or is offered."""
        return sorted({p.region for i in self.instances.values() for p in i.price}
                      | {r for i in self.instances.values() for r in i.regions})

    def region(self, name: str, inst: Instance | None = None, *, need_price: bool = False) -> str:
        """`name` as the catalog spells it (case and separators ignored), or a UsageError with the
        nearest regions. With `inst` and `need_price`: a region where that instance has a price."""
        known = {normalize_name(r): r for r in self.regions}
        region = known.get(normalize_name(name))
        if inst is None or not need_price:
            if region is None:
                hint = did_you_mean(closest(name, self.regions))
                priced = sorted({r for i in self.instances.values() for r in priced_regions(i)})
                raise UsageError(f"unknown region '{printable(name)}'.{hint} The catalog has prices in: "
                                 f"{', '.join(priced) or 'no region'} (`trainready catalog instances --json` "
                                 f"lists every instance's regions).")
            return region
        priced = priced_regions(inst)
        if region is not None and region in priced:
            return region
        if not priced:
            raise UsageError(f"{inst.name} has no price in the catalog, in any region: give --usd-per-hour "
                             f"(or leave out --region)")
        if region is None:
            hint = did_you_mean(closest(name, priced) or closest(name, self.regions))
            raise UsageError(f"unknown region '{printable(name)}'.{hint} {inst.name} has a price in: "
                             f"{', '.join(priced)}.")
        raise UsageError(f"{inst.name} has no price in {region} in the catalog; it has one in: "
                         f"{', '.join(priced)}. Give one of those as --region, or your price as --usd-per-hour.")


def priced_regions(inst: Instance) -> list[str]:
    """The regions where the catalog has a price for `inst`, on-demand or spot."""
    return sorted({p.region for p in inst.price if p.usd_per_hour is not None})


def read_toml(text: str, label: str) -> dict[str, Any]:
    """Parse TOML text; a syntax error (or absurd nesting) is a UsageError naming `label`."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{label}: not valid TOML: {exc}") from None
    except RecursionError:
        raise UsageError(f"{label}: not valid TOML: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (Python's int limit)
        raise UsageError(f"{label}: not valid TOML: {exc}") from None


def _locate(text: str, loc: tuple[Any, ...]) -> int | None:
    """Line number (1-based) of the field a validation error points at, best effort.

    `loc` is like ("instance", 2, "price", 0, "usd_per_hour"): walk the array-of-tables
    headers in order, then find `key =` inside the table found.
    """
    lines = text.splitlines()
    start, end = 0, len(lines)
    table_path: list[str] = []
    i = 0
    line_no: int | None = None
    while i < len(loc):
        key = loc[i]
        if isinstance(key, str) and i + 1 < len(loc) and isinstance(loc[i + 1], int):
            table_path.append(key)
            header = re.compile(r"^\s*\[\[\s*" + re.escape(".".join(table_path)) + r"\s*\]\]")
            hits = [n for n in range(start, end) if header.match(lines[n])]
            if not hits:  # an inline array (aliases = [...]): the line of its key
                return _key_line(lines, key, start, end) or line_no
            if loc[i + 1] >= len(hits):
                return line_no
            start = hits[loc[i + 1]]
            line_no = start + 1
            nxt = [n for n in range(start + 1, end)
                   if re.match(r"^\s*\[\[?\s*" + re.escape(".".join(table_path)) + r"\s*\]\]?", lines[n])]
            end = nxt[0] if nxt else end
            i += 2
            continue
        if isinstance(key, str):
            return _key_line(lines, key, start, end) or line_no
        return line_no
    return line_no


def _key_line(lines: list[str], key: str, start: int, end: int) -> int | None:
    """Line number (1-based) of `key =` (or `a.key =`) between lines start and end."""
    pat = re.compile(r"^\s*(" + re.escape(key) + r"|[\w.]*\." + re.escape(key) + r")\s*=")
    return next((n + 1 for n in range(start, end) if pat.match(lines[n])), None)


def _validation_message(exc: ValidationError, text: str, label: str, prefix: tuple) -> str:
    msgs = []
    for err in exc.errors():
        loc = prefix + tuple(err["loc"])
        line = _locate(text, loc)
        where = f"{label}:{line}" if line else label
        fld = ".".join(str(p) for p in loc if not isinstance(p, int)) or "(entry)"
        msgs.append(f"{where}: field '{fld}': {err['msg']}")
    return "\n".join(msgs)


def _tables(value: Any, key: str, text: str, label: str) -> list[dict]:
    """`value` must be an array of tables (`[[key]]`): anything else names the key and its line."""
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return value
    last = key.split(".")[-1]
    pattern = re.compile(r"^\s*(\[+\s*" + re.escape(key) + r"\s*\]|" + re.escape(last) + r"\s*=)")
    line = next((n for n, ln in enumerate(text.splitlines(), 1) if pattern.match(ln)), None)
    where = f"{label}:{line}" if line else label
    raise UsageError(f"{where}: '{last}' must be written as [[{key}]] tables, one per entry "
                     f"(found {_kind(value)})")


def _kind(value: Any) -> str:
    """What a TOML value is, in TOML's words."""
    if isinstance(value, dict):
        return "a single table"
    if isinstance(value, list):
        inner = next((v for v in value if not isinstance(v, dict)), None)
        return f"an array holding {_kind(inner)}"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string"
    return "a date or time"


def _entries(data: dict, text: str, label: str) -> dict[str, list]:
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise UsageError(f"{label}: schema_version {version!r} is not supported; this trainready reads "
                         f"schema_version = {SCHEMA_VERSION}")
    unknown = set(data) - {"schema_version", "gpu", "instance"}
    if unknown:
        keys = ", ".join(printable(k) for k in sorted(unknown))
        raise UsageError(f"{label}: unknown top-level key(s) {keys}; expected [[gpu]] and [[instance]] tables")
    if "gpu" not in data and "instance" not in data:
        raise UsageError(f"{label}: no [[gpu]] or [[instance]] tables: nothing to merge "
                         f"(see docs/catalog.md for the format)")
    return {k: _tables(data.get(k, []), k, text, label) for k in ("gpu", "instance")}


def _build(kind: str, raw: dict, text: str, label: str, index: int):
    model = Gpu if kind == "gpu" else Instance
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise UsageError(_validation_message(exc, text, label, (kind, index))) from None


def _merge_into(gpus: dict, instances: dict, text: str, label: str, user: bool) -> None:
    data = read_toml(text, label)
    entries = _entries(data, text, label)
    for idx, raw in enumerate(entries["gpu"]):
        raw = dict(raw)
        name = raw.get("name") if isinstance(raw.get("name"), str) else None  # else validation names it
        if user:
            raw.setdefault("source", f"user catalog {label}")
            if name in gpus:
                raw = {**gpus[name].model_dump(exclude_defaults=True), **raw}
        gpu = _build("gpu", raw, text, label, idx)
        gpus[gpu.name] = gpu
    for idx, raw in enumerate(entries["instance"]):
        raw = dict(raw)
        name = raw.get("name") if isinstance(raw.get("name"), str) else None
        if user:
            raw.setdefault("source", f"user catalog {label}")
            if "price" in raw:
                raw["price"] = [dict(p) for p in _tables(raw["price"], "instance.price", text, label)]
            for p in raw.get("price", []):
                p.setdefault("source", f"user catalog {label}")
            if name in instances:
                base = instances[name].model_dump(exclude_defaults=True, exclude={"expected_nvlink"})
                prices: dict[Any, dict] = {(p["region"], p["model"]): p for p in base.get("price", [])}
                for n, p in enumerate(raw.get("price", [])):
                    # an entry without region or model stays on its own, for validation to name it
                    key = (p.get("region"), p.get("model"))
                    prices[key if all(isinstance(k, str) for k in key) else n] = p
                raw = {**base, **raw, "price": list(prices.values())}
        if isinstance(raw.get("gpu"), str):  # accept any GPU alias, store the canonical name
            raw["gpu"] = _gpu_aliases(gpus).get(normalize_name(raw["gpu"]), raw["gpu"])
        inst = _build("instance", raw, text, label, idx)
        if inst.gpu not in gpus:
            line = _locate(text, ("instance", idx, "gpu"))
            where = f"{label}:{line}" if line else label
            raise UnknownNameError("GPU", inst.gpu, gpus, f"({where}: field 'instance.gpu')")
        instances[inst.name] = inst


def _gpu_aliases(gpus: dict[str, Gpu]) -> dict[str, str]:
    index: dict[str, str] = {}
    for gpu in gpus.values():
        for alias in (gpu.name, gpu.display_name, *gpu.aliases):
            if alias:
                index.setdefault(normalize_name(alias), gpu.name)
    return index


@functools.lru_cache(maxsize=1)
def _builtin_data() -> tuple[dict[str, Gpu], dict[str, Instance]]:
    """The data files as written (prices not yet flagged: a user's file may change them)."""
    gpus: dict[str, Gpu] = {}
    instances: dict[str, Instance] = {}
    pkg = resources.files("trainready.catalog") / "data"
    for fname in ("gpus.toml", "instances.toml"):
        _merge_into(gpus, instances, (pkg / fname).read_text(), f"<builtin>/{fname}", user=False)
    return gpus, instances


@functools.lru_cache(maxsize=1)
def _builtin() -> Catalog:
    gpus, instances = _builtin_data()
    return Catalog(gpus=dict(gpus), instances=dict(instances))


def load_catalog(user_file: str | Path | None = None) -> Catalog:
    """The built-in catalog, with a user's TOML file merged on top when given.

    A user's entry with a known name overrides the fields it gives (prices merge by
    region and pricing model); a new name adds a GPU or an instance type.
    """
    if user_file is None:
        return _builtin()
    path = Path(user_file)
    text = read_user_text(path, "catalog file")
    gpus, instances = (dict(d) for d in _builtin_data())
    _merge_into(gpus, instances, text, printable(path), user=True)  # the label names it in messages
    return Catalog(gpus=gpus, instances=instances, files=(str(path),))
