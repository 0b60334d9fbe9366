"""Which GPUs the node has: how many (and which are lost), what model, which driver."""

from __future__ import annotations

from trainready.errors import normalize_name

from ..facts import Facts, source_name
from ..facts.gpu import SMI_Q, csv_rows, smi_q
from ..registry import Verdict, check
from .common import NO_GPU_ADVICE, Presence, presence


@check("gpu.count", "gpu", needs=("inventory", "lost"), decisive=True)
def gpu_count(f: Facts) -> Verdict:
    seen, inv, ctx = presence(f), f.inventory, f.ctx
    expected = ctx.gpu_count
    lost = {k: v for k, v in inv.lost.items() if inv.lost_bus.get(k) not in inv.listed_buses}
    relisted = {k: v for k, v in inv.lost.items() if k not in lost}
    if not seen.count and not lost:
        return _no_gpu(f, seen)
    found = seen.count or 0
    lost_text = "; ".join(f"{f.label(k)} lost: {v[0].value} ({source_name(v[0].source)})" for k, v in lost.items())
    via = "" if seen.source == "nvidia-smi-query-gpu.csv" and not seen.why else \
        f" (counted by {source_name(seen.source)}" + (f"; {seen.why}" if seen.why else "") + ")"
    shown = "GPU count not listed" if seen.count is None else f"{'at least ' if not seen.exact else ''}{found} GPUs reachable"
    v = Verdict("pass", observed=shown + (f", {len(lost)} lost" if lost else ""), expected=ctx.expect(f"{expected} GPUs"))
    disagree = _disagreement(f, seen)
    if ctx.cpu_only:
        v.status, v.expected = "warn", "no GPU (--cpu-only)"
        v.reason, v.advice = f"--cpu-only says this node has no GPU, but {found} are visible" + via, "drop --cpu-only to check the GPUs"
        return v
    if lost:
        v.status, v.lost = "fail", "only"
        v.reason = lost_text + (f"; {found} of {expected} reachable" if expected and seen.count is not None else "") + \
            (f"; the driver knows {inv.attached.value} (nvidia-smi -q Attached GPUs)" if inv.attached else "")
        v.advice = ("a lost GPU needs a node reboot at least (NVIDIA: Xid 79 -> restart the node); if it recurs, "
                    "stop/start the instance for other hardware or drain the node")
        total = expected or (inv.attached.value if inv.attached else None)
        if total and seen.count is not None and found + len(lost) < total:
            v.lost = "also"  # more missing than the lost ones explain
            v.reason += f"; {total - found - len(lost)} more missing that no file explains"
        return v
    attached = inv.attached.value if inv.attached else None
    if attached and found < attached and complete_report(f):
        v.status = "fail"
        v.reason = (f"nvidia-smi -q lists {found} GPUs of the {attached} the driver knows (Attached GPUs), and the report "
                    "is not cut short: the others cannot be read" + via)
        v.advice = "check `nvidia-smi -L` and the kernel log for Xid 79 (fallen off the bus); reboot, else replace the node"
        return v
    if expected is None:
        v.status, v.reason = "warn", f"{ctx.unknown_instance}: cannot tell how many GPUs there should be" + via
        v.advice = "pass --instance TYPE (e.g. p4d.24xlarge)"
    elif found < expected and seen.exact:
        v.status = "fail"
        v.reason = f"found {found} GPUs, expected {expected}: {expected - found} missing (fallen off the bus or not visible)" + via
        v.advice = "check `nvidia-smi -L` and the kernel log for Xid 79; stop/start the instance to get other hardware"
    elif found < expected:
        v.status, v.partial = "warn", True
        v.reason = f"the output shows {found} of {expected} GPUs, but it is cut short or elided" + via
        v.advice = "collect the full output: trainready check collect --out DIR"
    elif found > expected:
        v.status, v.reason, v.advice = "warn", f"found {found} GPUs, more than the {expected} of {ctx.instance.name}" + via, "check --instance"
    else:
        v.reason = f"all {found} GPUs visible" + via
    if relisted and v.status == "pass":
        v.status = "warn"
        v.reason = ("the kernel log says " + "; ".join(f"{f.label(k)}: {s[0].value}" for k, s in relisted.items()) +
                    ", but nvidia-smi lists it now: sources disagree (a log from before a reset?)")
        v.advice = "reboot before training; if it recurs, drain the node"
    if disagree:
        v.reason += f"; sources disagree: {disagree}"
        if v.status == "pass":
            v.status = "warn"
            v.advice = "run `nvidia-smi -L` and `python -c 'import torch; print(torch.cuda.device_count())'` on the node"
    return v


def complete_report(f: Facts) -> bool:
    """nvidia-smi -q was not cut short: no elision, and its last GPU section ends with the Processes block
    nvidia-smi prints last for every GPU (so sections missing from it were never printed)."""
    report, paste = smi_q(f), f.paste(SMI_Q)
    if report is None or not report.gpus or paste is None or paste.elided:
        return False
    return any(key.split("/")[0] == "Processes" for key in report.gpus[-1].fields) or \
        paste.text.rstrip().splitlines()[-1].strip().startswith("Processes")


def _disagreement(f: Facts, seen: Presence) -> str:
    counts = {s.source: s.value for s in f.inventory.reachable}
    if len(set(counts.values())) > 1:
        return ", ".join(f"{source_name(src)} shows {n}" for src, n in counts.items())
    return ""


def _no_gpu(f: Facts, seen: Presence) -> Verdict:
    ctx = f.ctx
    expected = f"{ctx.gpu_count} GPUs" if ctx.gpu_count else "at least one GPU (training needs one)"
    if seen.count is None:
        return Verdict("skip", expected="no GPU (--cpu-only)" if ctx.cpu_only else expected,
                       reason=f"cannot count GPUs: {seen.why}",
                       advice="" if ctx.cpu_only else "collect the bundle with `trainready check collect` on the node")
    if ctx.cpu_only:
        return Verdict("pass", observed="no GPU", expected="no GPU (--cpu-only)", reason=f"CPU-only node, as --cpu-only says: {seen.why}")
    return Verdict("fail", observed="no GPU visible", expected=expected,
                   reason=(f"{ctx.instance.name} has {ctx.gpu_count} GPUs; " if ctx.instance and ctx.gpu_count else
                           "training needs a GPU; ") + seen.why,
                   advice=NO_GPU_ADVICE + "; if this node is meant to have none, pass --cpu-only")


def _model_matches(f: Facts, name: str, memory_mib: float | None) -> bool:
    gpu = f.ctx.gpu
    observed = normalize_name(name)
    names = [gpu.name, gpu.display_name, *gpu.aliases]
    family = gpu.name.split("-")[0]  # a100, h100, v100, a10g ...
    if family not in observed and not any(normalize_name(n) in observed for n in names if n):
        return False
    return memory_mib is None or abs(memory_mib / 1024 - gpu.memory_gib) <= 0.1 * gpu.memory_gib


@check("gpu.model", "gpu", needs=("model",), gpu=True)
def gpu_model(f: Facts) -> Verdict | None:
    fact, ctx = f.model, f.ctx
    names = {k: s.value for k in fact.gpus() if (s := fact.first(k))}
    if not names:
        return None
    shown = sorted({f"{n} ({m} MiB)" if m else n for n, m in names.values()})
    # the table and nvlink -s shorten names ("Tesla V100-SXM2..."): compare the fullest name per GPU
    models = sorted({n.rstrip(".") for n, _ in names.values()})
    v = Verdict("pass", observed=", ".join(shown),
                expected=ctx.expect(f"{ctx.gpu.display_name or ctx.gpu.name} ({ctx.gpu.memory_gib:g} GiB)" if ctx.gpu else ""))
    sizes = {m for _, m in names.values() if m}
    if len(models) > 1 or len(sizes) > 1:
        v.status, v.reason = "fail", "GPUs of different models or memory sizes in one node"
        v.advice = "a mixed node cannot train symmetrically; replace the node"
    elif ctx.gpu is None:
        v.status, v.reason, v.advice = "warn", ctx.unknown_instance, "pass --instance TYPE"
    elif not all(_model_matches(f, n, m) for n, m in names.values()):
        v.status, v.reason = "fail", f"not the {ctx.gpu.name} that {ctx.instance.name} comes with"
        v.advice = "check --instance; if right, this is not the hardware you pay for: open a support case"
    else:
        v.reason = "every GPU is the expected model"
    if disagree := fact.disagreements(f.table, show=lambda x: x[0]):
        v.reason += "; names differ between sources: " + "; ".join(disagree[:3])
    return v


@check("gpu.driver", "gpu", needs=("driver",), gpu=True)
def gpu_driver(f: Facts) -> Verdict | None:
    sources: dict[str, str] = {}
    report = smi_q(f)
    if report is not None and report.driver_version:
        sources[report.driver_version] = SMI_Q
    for _, row in csv_rows(f):
        if row.driver_version:
            sources.setdefault(row.driver_version, "nvidia-smi-query-gpu.csv")
    drivers = sorted(sources)
    if not drivers:
        return None
    cuda = report.cuda_version if report is not None else None
    v = Verdict("pass", observed=f"driver {', '.join(drivers)}" + (f", CUDA {cuda}" if cuda else ""),
                expected="one driver, >= 525 (CUDA 12)")
    major = _major(drivers[0])
    if len(drivers) > 1:
        v.status = "fail"
        v.reason = "GPUs report different driver versions (a half-finished upgrade): " + \
            ", ".join(f"{source_name(s)} says {d}" for d, s in sources.items())
        v.advice = "reboot after the driver upgrade"
    elif major is not None and major < 525:
        v.status, v.reason = "warn", f"driver {drivers[0]} predates CUDA 12: current PyTorch wheels need >= 525"
        v.advice = "update the NVIDIA driver (or use a current Deep Learning AMI)"
    else:
        v.reason = "driver version consistent" + ("" if cuda else " (CUDA version not reported without nvidia-smi -q)")
    return v


def _major(version: str) -> int | None:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return None

