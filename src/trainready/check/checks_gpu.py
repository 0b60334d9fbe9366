"""GPU checks: count, model, driver, ECC, XID, throttling, PCIe, NVLink topology and links."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .context import Context
from .findings import Finding, skip
from .parsers import nvsmi
from .registry import check

QUERY = "nvidia-smi-query-gpu.csv"
TOPO = "nvidia-smi-topo-m.txt"
NO_GPU_ADVICE = "install the NVIDIA driver (nvidia-smi must run), or run on a GPU node"
# what nvidia-smi prints when it sees no GPU: evidence, unlike output we cannot parse
NO_GPU_WORDS = re.compile(r"NVIDIA-SMI has failed|No devices were found|couldn't communicate with the NVIDIA driver|"
                          r"No supported GPUs|Unable to determine the device handle|GPU is lost", re.I)


def _rows(ctx: Context) -> list | None:
    query = ctx.parsed(QUERY, nvsmi.parse_query_gpu)
    return None if query is None else query.rows


@dataclass
class Presence:
    """How many GPUs the bundle shows, from every file that can tell (one root cause, one finding:
    gpu.count reports it, the checks that need a GPU point at gpu.count)."""

    count: int | None  # None: nothing in the bundle can tell
    source: str = ""  # where the count comes from
    why: str = ""  # when count is 0/None, or a GPU tool is missing: why, in the tool's own words


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "(empty output)")[:160]


def presence(ctx: Context) -> Presence:
    """Worked out once per analysis (every GPU check asks)."""
    if "__gpu_presence__" not in ctx._parsed:
        ctx._parsed["__gpu_presence__"] = _presence(ctx)
    return ctx._parsed["__gpu_presence__"]


def _presence(ctx: Context) -> Presence:
    from .probes import cuda_summary

    bundle = ctx.bundle
    rows = _rows(ctx)
    if rows:
        return Presence(len(rows), "nvidia-smi --query-gpu")
    topo_text = bundle.text(TOPO)
    if topo_text is not None and (n := len(nvsmi.parse_topo(topo_text).gpus)):
        return Presence(n, "nvidia-smi topo -m", "" if rows is not None else bundle.why_missing(QUERY))
    # nvidia-smi ran and said there is no GPU (its own words), or failed: the driver cannot see one
    query_text = bundle.text(QUERY)
    for text in (query_text, topo_text):
        if text is not None and (NO_GPU_WORDS.search(text) or (text is query_text and rows is not None and
                                                                 ctx.parsed(QUERY, nvsmi.parse_query_gpu).fields)):
            said = NO_GPU_WORDS.search(text)
            return Presence(0, "nvidia-smi", f"nvidia-smi listed no GPU: {_first_line(text[said.start():] if said else text)}")
    if query_text is not None or topo_text is not None:  # output we cannot read is not evidence of no GPU
        unread = _first_line(query_text if query_text is not None else topo_text or "")
        return Presence(None, "", f"nvidia-smi output unreadable (first line {unread[:80]!r})")
    state = bundle.probe_state(QUERY)
    if state in ("failed", "empty"):
        return Presence(0, "nvidia-smi", bundle.why_missing(QUERY) if state == "failed" else "nvidia-smi listed no GPU")
    # no nvidia-smi output: torch may still see GPUs (containers often lack nvidia-smi)
    cuda = cuda_summary(bundle) or {}
    missing = bundle.why_missing(QUERY)
    if cuda.get("cuda_available") and isinstance(cuda.get("device_count"), int) and cuda["device_count"] > 0:
        return Presence(cuda["device_count"], "torch (cuda.json)", missing)
    if state == "not-installed":  # evidence: no driver tools on the machine
        return Presence(0, "nvidia-smi", missing)
    return Presence(None, "", f"{missing}; nothing else in the bundle counts GPUs")


def _see_count(ctx: Context, check_id: str, need: str = QUERY) -> Finding | None:
    """The skip of a check that needs a GPU (or nvidia-smi output) when gpu.count already reports why
    there is none: one root cause, one finding. None when this check has its own story to tell."""
    seen = presence(ctx)
    if seen.count == 0:
        reason = "CPU-only node (--cpu-only): no GPU to check" if ctx.cpu_only else "no GPU visible: see gpu.count"
        return skip(check_id, "gpu", reason)
    if seen.count is None:
        return skip(check_id, "gpu", "no GPU output to read: see gpu.count")
    if ctx.bundle.text(need) is None and ctx.bundle.probe_state(need) == "not-installed":
        return skip(check_id, "gpu", f"needs `{ctx.bundle.record(need).command.split()[0]}` output: see gpu.count")
    return None


def _no_query(check_id: str, ctx: Context) -> Finding:
    folded = _see_count(ctx, check_id)
    if folded is not None:
        return folded
    text = ctx.bundle.text(QUERY)
    if text is None:
        return skip(check_id, "gpu", ctx.bundle.why_missing(QUERY), NO_GPU_ADVICE)
    return skip(check_id, "gpu", f"nvidia-smi --query-gpu gave no GPU rows: {_first_line(text)[:120]}", NO_GPU_ADVICE)


@check("gpu.count", "gpu")
def gpu_count(ctx: Context) -> Finding:
    seen = presence(ctx)
    expected = ctx.gpu_count
    if not seen.count:
        return _no_gpu(ctx, seen)
    found = seen.count
    via = "" if seen.source == "nvidia-smi --query-gpu" else f" (counted by {seen.source}; {seen.why})" if seen.why \
        else f" (counted by {seen.source})"
    finding = Finding(id="gpu.count", area="gpu", status="pass", observed=f"{found} GPUs",
                      expected=ctx.expect(f"{expected} GPUs"))
    if ctx.cpu_only:
        finding.status, finding.expected = "warn", "no GPU (--cpu-only)"
        finding.reason = f"--cpu-only says this node has no GPU, but {found} are visible" + via
        finding.advice = "drop --cpu-only to check the GPUs"
    elif expected is None:
        finding.status, finding.reason = "warn", f"{ctx.unknown_instance}: cannot tell how many GPUs there should be" + via
        finding.advice = "pass --instance TYPE (e.g. p4d.24xlarge)"
    elif found < expected:
        finding.status = "fail"
        finding.reason = f"found {found} GPUs, expected {expected}: {expected - found} missing (fallen off the bus or not visible)" + via
        finding.advice = "check `nvidia-smi -L` and the kernel log for Xid 79; stop/start the instance to get other hardware"
    elif found > expected:
        finding.status, finding.reason = "warn", f"found {found} GPUs, more than the {expected} of {ctx.instance.name}" + via
        finding.advice = "check --instance"
    else:
        finding.reason = f"all {found} GPUs visible" + via
    return finding


def _no_gpu(ctx: Context, seen: Presence) -> Finding:
    """No GPU visible (count 0), or nothing to count from (None)."""
    expected = f"{ctx.gpu_count} GPUs" if ctx.gpu_count else "at least one GPU (training needs one)"
    if seen.count is None:
        return Finding(id="gpu.count", area="gpu", status="skip", expected="no GPU (--cpu-only)" if ctx.cpu_only else expected,
                       reason=f"cannot count GPUs: {seen.why}",
                       advice="" if ctx.cpu_only else "collect the bundle with `trainready check collect` on the node")
    if ctx.cpu_only:
        return Finding(id="gpu.count", area="gpu", status="pass", observed="no GPU", expected="no GPU (--cpu-only)",
                       reason=f"CPU-only node, as --cpu-only says: {seen.why}")
    return Finding(id="gpu.count", area="gpu", status="fail", observed="no GPU visible", expected=expected,
                   reason=(f"{ctx.instance.name} has {ctx.gpu_count} GPUs; " if ctx.instance and ctx.gpu_count else
                           "training needs a GPU; ") + seen.why,
                   advice=NO_GPU_ADVICE + "; if this node is meant to have none, pass --cpu-only")


def _model_matches(ctx: Context, name: str, memory_mib: float | None) -> bool:
    from trainready.errors import normalize_name

    gpu = ctx.gpu
    observed = normalize_name(name)
    names = [gpu.name, gpu.display_name, *gpu.aliases]
    family = gpu.name.split("-")[0]  # a100, h100, v100, a10g ...
    if family not in observed and not any(normalize_name(n) in observed for n in names if n):
        return False
    return memory_mib is None or abs(memory_mib / 1024 - gpu.memory_gib) <= 0.1 * gpu.memory_gib


@check("gpu.model", "gpu")
def gpu_model(ctx: Context) -> Finding:
    rows = _rows(ctx)
    if not rows:
        return _no_query("gpu.model", ctx)
    models = sorted({f"{r.name or '?'} ({r.memory_total_mib:.0f} MiB)" if r.memory_total_mib else (r.name or "?") for r in rows})
    finding = Finding(id="gpu.model", area="gpu", status="pass", observed=", ".join(models),
                      expected=ctx.expect(f"{ctx.gpu.display_name or ctx.gpu.name} ({ctx.gpu.memory_gib:g} GiB)" if ctx.gpu else ""))
    if len(models) > 1:
        finding.status, finding.reason = "fail", "GPUs of different models or memory sizes in one node"
        finding.advice = "a mixed node cannot train symmetrically; replace the node"
    elif ctx.gpu is None:
        finding.status, finding.reason, finding.advice = "warn", "instance type unknown", "pass --instance TYPE"
    elif not all(_model_matches(ctx, r.name or "", r.memory_total_mib) for r in rows):
        finding.status, finding.reason = "fail", f"not the {ctx.gpu.name} that {ctx.instance.name} comes with"
        finding.advice = "check --instance; if right, this is not the hardware you pay for: open a support case"
    else:
        finding.reason = "every GPU is the expected model"
    return finding


@check("gpu.driver", "gpu")
def gpu_driver(ctx: Context) -> Finding:
    rows = _rows(ctx)
    smi_q = ctx.parsed("nvidia-smi-q.txt", nvsmi.parse_smi_q)
    drivers = sorted({r.driver_version for r in rows or [] if r.driver_version})
    if not drivers and smi_q is not None and smi_q.driver_version:
        drivers = [smi_q.driver_version]
    if not drivers:
        return _no_query("gpu.driver", ctx)
    cuda = smi_q.cuda_version if smi_q is not None else None
    observed = f"driver {', '.join(drivers)}" + (f", CUDA {cuda}" if cuda else "")
    finding = Finding(id="gpu.driver", area="gpu", status="pass", observed=observed, expected="one driver, >= 525 (CUDA 12)")
    major = _major(drivers[0])
    if len(drivers) > 1:
        finding.status, finding.reason = "fail", "GPUs report different driver versions (a half-finished upgrade)"
        finding.advice = "reboot after the driver upgrade"
    elif major is not None and major < 525:
        finding.status, finding.reason = "warn", f"driver {drivers[0]} predates CUDA 12: current PyTorch wheels need >= 525"
        finding.advice = "update the NVIDIA driver (or use a current Deep Learning AMI)"
    else:
        finding.reason = "driver version consistent" + ("" if cuda else " (CUDA version not reported without nvidia-smi -q)")
    return finding


def _label(row, position: int) -> str:
    """A GPU's index as nvidia-smi printed it; the row's position (#N) where the index is unreadable."""
    return str(row.index) if row.index is not None else f"#{position}"


def _major(version: str) -> int | None:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "") else None
    except ValueError:
        return None


def _memory_repairs(ctx: Context) -> tuple[list[str], list[str]]:
    """From `nvidia-smi -q`: (failures, warnings) about retired pages and remapped rows."""
    smi_q = ctx.parsed("nvidia-smi-q.txt", nvsmi.parse_smi_q)
    if smi_q is None:
        return [], []
    fails, warns = [], []
    for gpu in smi_q.gpus:
        rows, pages = gpu.remapped_rows, gpu.retired_pages
        if rows.failure_occurred:
            fails.append(f"GPU {gpu.index}: row remapping failed (no spare rows left)")
        if rows.pending or pages.pending:
            warns.append(f"GPU {gpu.index}: a {'row remap' if rows.pending else 'page retirement'} is pending until the GPU is reset")
        if rows.uncorrectable:
            warns.append(f"GPU {gpu.index}: {rows.uncorrectable} rows remapped after uncorrectable errors")
        if pages.double_bit:
            warns.append(f"GPU {gpu.index}: {pages.double_bit} pages retired after double-bit errors")
    return fails, warns


def _with_repairs(finding: Finding, ctx: Context) -> Finding:
    fails, warns = _memory_repairs(ctx)
    if fails:
        finding.status = "fail"
        finding.reason = "; ".join([*fails, finding.reason])[:500]
        finding.advice = "the GPU has run out of spare memory rows: drain the node / stop-start the instance (RMA)"
    elif warns and finding.status == "pass":
        finding.status = "warn"
        finding.reason = "; ".join(warns)[:500]
        finding.advice = "reset the GPUs (nvidia-smi -r, or reboot) so pending repairs take effect, then re-check"
    elif warns:
        finding.reason = "; ".join([finding.reason, *warns])[:500]
    return finding


@check("gpu.ecc", "gpu")
def gpu_ecc(ctx: Context) -> Finding:
    return _with_repairs(_ecc_counts(ctx), ctx)


def _ecc_counts(ctx: Context) -> Finding:
    rows = _rows(ctx)
    if not rows:
        return _no_query("gpu.ecc", ctx)
    volatile = {_label(r, k): _int(r.get("ecc.errors.uncorrected.volatile.total")) for k, r in enumerate(rows)}
    aggregate = {_label(r, k): _int(r.get("ecc.errors.uncorrected.aggregate.total")) for k, r in enumerate(rows)}
    if all(v is None for v in volatile.values()) and all(v is None for v in aggregate.values()):
        return skip("gpu.ecc", "gpu", "ECC counters not reported (ECC off or not supported on this GPU)",
                    "on data-center GPUs enable ECC: nvidia-smi -e 1, then reboot")
    bad_now = {i: v for i, v in volatile.items() if v}
    bad_ever = {i: v for i, v in aggregate.items() if v}
    observed = f"uncorrectable volatile: {sum(bad_now.values())}, aggregate: {sum(bad_ever.values())}"
    finding = Finding(id="gpu.ecc", area="gpu", status="pass", observed=observed, expected="0 uncorrectable errors")
    if bad_now:
        finding.status = "fail"
        finding.reason = "uncorrectable ECC errors since boot on GPU " + ", ".join(f"{i} ({n})" for i, n in bad_now.items())
        finding.advice = "do not train here: stop/start the instance (new hardware) or drain the node"
    elif bad_ever:
        finding.status = "warn"
        finding.reason = "uncorrectable ECC errors in the GPU's lifetime on GPU " + ", ".join(str(i) for i in bad_ever)
        finding.advice = "watch for retired/remapped rows (nvidia-smi -q -d ROW_REMAPPER); replace if they recur"
    else:
        finding.reason = "no uncorrectable ECC errors"
    return finding


@check("gpu.xid", "gpu")
def gpu_xid(ctx: Context) -> Finding:
    from .parsers import system

    text = ctx.bundle.text("kernel-xid.txt")
    if text is None:
        return skip("gpu.xid", "gpu", ctx.bundle.why_missing("kernel-xid.txt"), "run as root (dmesg) to read the kernel log")
    log = system.parse_xid(text)
    if not log.readable:
        if ctx.bundle.source == "live":
            return skip("gpu.xid", "gpu", "kernel log not readable (dmesg needs root here)", "sudo trainready check")
        return skip("gpu.xid", "gpu", f"kernel log was not readable on {ctx.bundle.machine} (dmesg needs root there)",
                    "collect the bundle again as root there: sudo trainready check collect --out DIR")
    if not log.events:
        return Finding(id="gpu.xid", area="gpu", status="pass", observed="no Xid errors in the kernel log",
                       expected="no Xid errors", reason="kernel log read, no NVRM Xid lines")
    codes = sorted({e.code for e in log.events})
    meanings = "; ".join(f"Xid {c}: {system.XID_MEANINGS.get(c, 'not in our table')}" for c in codes)
    fatal = [c for c in codes if system.XID_SEVERITY.get(c) == "fatal"]
    return Finding(id="gpu.xid", area="gpu", status="fail" if fatal else "warn",
                   observed=f"{len(log.events)} Xid events: codes {', '.join(map(str, codes))}", expected="no Xid errors",
                   reason=meanings[:400],
                   advice="fatal Xids (e.g. 48, 79, 94/95) mean bad hardware: stop/start the instance or drain the node"
                   if fatal else "look up the codes in NVIDIA's Xid catalog; a crash of your own job can cause 13/31/43")


# nvidia-smi clocks_event_reasons bits that mean the hardware is holding clocks down; idle (0x1),
# application clocks (0x2), SW power cap (0x4, normal under load), sync boost (0x10) and
# display clocks (0x100) do not.
_HARMFUL_THROTTLE = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake"}


def _throttle_bits(value: str) -> int | None:
    try:
        return int(value, 16) if value.lower().startswith("0x") else int(value)
    except ValueError:
        return None


@check("gpu.throttle", "gpu")
def gpu_throttle(ctx: Context) -> Finding:
    rows = _rows(ctx)
    if not rows:
        return _no_query("gpu.throttle", ctx)
    reasons = {_label(r, k): r.get("clocks_throttle_reasons.active") for k, r in enumerate(rows)}
    if all(v is None for v in reasons.values()):
        return skip("gpu.throttle", "gpu", "throttle reasons not reported", "")
    bad, unreadable = {}, []
    for index, value in reasons.items():
        bits = _throttle_bits(value) if value else 0
        if bits is None:
            unreadable.append(f"GPU {index}: {value!r}")
            continue
        names = [name for bit, name in _HARMFUL_THROTTLE.items() if bits & bit]
        if names:
            bad[index] = f"{value} ({', '.join(names)})"
    finding = Finding(id="gpu.throttle", area="gpu", status="pass", expected="no thermal/power/HW slowdown",
                      observed="none active" if not bad else "; ".join(f"GPU {i}: {v}" for i, v in bad.items()))
    if bad:
        finding.status = "warn"
        finding.reason = "clocks held down by the hardware (thermal, HW slowdown or power brake)"
        finding.advice = "read `nvidia-smi -q -d PERFORMANCE`; thermal/HW slowdown at idle means a cooling or power fault"
    elif unreadable:
        finding.status, finding.reason = "skip", "could not read the throttle mask: " + ", ".join(unreadable[:3])
    else:
        finding.reason = "no hardware slowdown (idle, application clocks and SW power cap are normal)"
    return finding


@check("gpu.pcie", "gpu")
def gpu_pcie(ctx: Context) -> Finding:
    rows = _rows(ctx)
    if not rows:
        return _no_query("gpu.pcie", ctx)
    degraded = []
    seen = 0
    for k, r in enumerate(rows):
        gen, gen_max = _int(r.get("pcie.link.gen.current")), _int(r.get("pcie.link.gen.max"))
        width, width_max = _int(r.get("pcie.link.width.current")), _int(r.get("pcie.link.width.max"))
        if None in (gen, gen_max, width, width_max):
            continue
        seen += 1
        if width < width_max:  # width never drops at idle; generation does (power saving)
            degraded.append(f"GPU {_label(r, k)} x{width} of x{width_max}")
    if not seen:
        return skip("gpu.pcie", "gpu", "PCIe link fields not reported", "")
    finding = Finding(id="gpu.pcie", area="gpu", status="pass", expected="full link width on every GPU",
                      observed="all at full width" if not degraded else "; ".join(degraded))
    if degraded:
        finding.status = "fail"
        finding.reason = "PCIe link trained narrower than the slot: host<->GPU copies (and GPUDirect) slow down"
        finding.advice = "reseat/replace (on cloud: stop/start the instance for other hardware)"
    else:
        finding.reason = "link width at maximum (the generation may idle lower to save power: that is normal)"
    return finding


@check("gpu.nvlink-topology", "gpu")
def nvlink_topology(ctx: Context) -> Finding:
    text = ctx.bundle.text(TOPO)
    folded = _see_count(ctx, "gpu.nvlink-topology", TOPO)
    if folded is not None:
        return folded
    if text is None:
        return skip("gpu.nvlink-topology", "gpu", ctx.bundle.why_missing(TOPO), NO_GPU_ADVICE)
    topo = nvsmi.parse_topo(text)
    n = len(topo.gpus)
    if n == 0:  # GPUs are there (gpu.count), this output does not show them: unreadable, not evidence
        line = topo.problems[0] if topo.problems else _first_line(text)[:120]
        return Finding(id="gpu.nvlink-topology", area="gpu", status="warn", observed="no GPU rows parsed",
                       expected="a GPU matrix", reason=f"could not parse nvidia-smi topo -m: {line}",
                       advice="run `nvidia-smi topo -m` by hand; a driver that cannot list GPUs needs reinstalling")
    pairs = topo.nvlink_pairs()
    counts = sorted({c for c in pairs.values()})
    observed = f"{n} GPUs; NVLink per pair: " + (", ".join(f"NV{c}" if c else "none" for c in counts) or "none")
    if topo.truncated:
        observed += " (output truncated)"
    expected_matrix = ctx.instance.expected_nvlink if ctx.instance else None
    if expected_matrix is None:
        return Finding(id="gpu.nvlink-topology", area="gpu", status="warn" if ctx.instance is None else "skip",
                       observed=observed, expected="unknown",
                       reason="instance type unknown" if ctx.instance is None else
                       f"the catalog does not know {ctx.instance.name}'s NVLink pattern",
                       advice="pass --instance TYPE" if ctx.instance is None else "compare with the vendor's diagram")
    short = []
    for i in range(min(n, len(expected_matrix))):
        for j in range(i + 1, min(n, len(expected_matrix))):
            want, got = expected_matrix[i][j], pairs.get((i, j))
            if got is None:
                continue  # not in the (truncated) output
            if got < want:
                short.append(f"GPU{i}-GPU{j} NV{got} (want NV{want})" if got else f"GPU{i}-GPU{j} none (want NV{want})")
    want_desc = _describe_expected(ctx, expected_matrix)
    finding = Finding(id="gpu.nvlink-topology", area="gpu", status="pass", observed=observed, expected=want_desc)
    if short:
        finding.status = "fail"
        finding.reason = f"{len(short)} GPU pairs with fewer NVLinks than {ctx.instance.name} has: " + "; ".join(short[:6])
        finding.advice = "NVLink/NVSwitch fault: all-reduce falls back to slower paths; stop/start the instance or drain the node"
    elif topo.truncated:
        finding.status, finding.reason = "warn", "output truncated: the pairs shown match, the rest could not be judged"
        finding.advice = "collect the full `nvidia-smi topo -m` output"
    else:
        finding.reason = _why_ok(ctx, expected_matrix)
    return finding


def _describe_expected(ctx: Context, matrix: list[list[int]]) -> str:
    values = sorted({v for i, row in enumerate(matrix) for j, v in enumerate(row) if i != j})
    if values == [0]:
        return f"no NVLink ({ctx.instance.name} is PCIe-only)"
    if len(values) == 1:
        return f"NV{values[0]} between every pair (NVSwitch)"
    return "hybrid cube-mesh: " + ", ".join(f"NV{v}" if v else "SYS (no NVLink)" for v in values) + " by pair"


def _why_ok(ctx: Context, matrix: list[list[int]]) -> str:
    values = {v for i, row in enumerate(matrix) for j, v in enumerate(row) if i != j}
    if values == {0}:
        return "PCIe-only instance: no NVLink is expected; GPU-GPU traffic crosses PCIe/host (slower all-reduce)"
    if 0 in values:
        return ("matches the V100 hybrid cube-mesh: some pairs have no NVLink and go through PCIe/the CPU, "
                "so all-reduce rings must route around them (what NCCL does)")
    return "every pair has the expected NVLinks"


@check("gpu.nvlink-links", "gpu")
def nvlink_links(ctx: Context) -> Finding:
    name = "nvidia-smi-nvlink-s.txt"
    text = ctx.bundle.text(name)
    if ctx.gpu is not None and not ctx.gpu.has_nvlink:
        return Finding(id="gpu.nvlink-links", area="gpu", status="pass", observed="not applicable",
                       expected=f"no NVLink on {ctx.gpu.name}", reason="PCIe-only GPU: no links to check")
    folded = _see_count(ctx, "gpu.nvlink-links", name)
    if folded is not None:
        return folded
    if text is None:
        return skip("gpu.nvlink-links", "gpu", ctx.bundle.why_missing(name), NO_GPU_ADVICE)
    status = nvsmi.parse_nvlink_status(text)
    if not status.gpus:
        return skip("gpu.nvlink-links", "gpu", "no NVLink status parsed" + (f": {status.problems[0]}" if status.problems else ""),
                    "run `nvidia-smi nvlink -s` by hand")
    want = ctx.gpu.nvlink_links if ctx.gpu else None
    speed = ctx.gpu.nvlink_link_gbps if ctx.gpu else None
    inactive, counts = [], {}
    for index, gpu in sorted(status.gpus.items()):
        active = [link for link in gpu.links if link.active]
        counts[index] = len(active)
        inactive += [f"GPU{index} link {link.id}" for link in gpu.links if not link.active]
        if speed:  # a link that trained at a lower rate is as bad as a missing one for all-reduce
            inactive += [f"GPU{index} link {link.id} at {link.speed_gbps:g} GB/s (want {speed:g})"
                         for link in active if link.speed_gbps is not None and link.speed_gbps < 0.9 * speed]
    observed = "active links per GPU: " + ", ".join(sorted({str(c) for c in counts.values()}))
    finding = Finding(id="gpu.nvlink-links", area="gpu", status="pass", observed=observed,
                      expected=f"{want} active links per GPU at {speed:g} GB/s" if want and speed else
                      f"{want} active links per GPU" if want else "every link active")
    few = {i: c for i, c in counts.items() if want and c < want}
    if status.problems and not inactive:  # snipped or garbled output: cannot count what is not there
        finding.status = "warn"
        finding.reason = f"output incomplete ({len(status.problems)} unparsed lines, e.g. {status.problems[0]}); " + \
            ("; ".join(f"GPU{i} shows {c} of {want}" for i, c in list(few.items())[:4]) or "links shown are active")
        finding.advice = "collect the full `nvidia-smi nvlink -s` output"
    elif inactive or few:
        finding.status = "fail"
        finding.reason = ("inactive: " + ", ".join(inactive[:8]) if inactive else "") + \
            ("; " if inactive and few else "") + ("; ".join(f"GPU{i} has {c} of {want}" for i, c in few.items()) if few else "")
        finding.advice = "an NVLink is down: GPU-GPU bandwidth drops; stop/start the instance or drain the node"
    else:
        finding.reason = "every link active"
    return finding
