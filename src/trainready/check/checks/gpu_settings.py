"""How the GPUs are set: persistence mode, application clocks, power limits, VBIOS, GSP firmware, MIG; and
whether something else already runs on them."""

from __future__ import annotations

from collections import Counter

from trainready.plan.efficiency import power_scale

from ..facts import Facts
from ..facts.gpu import SMI_Q
from ..parsers import node
from ..registry import Verdict, check
from .common import gpus, missing, settings


@check("gpu.persistence", "gpu", needs=("persistence",), gpu=True)
def persistence(f: Facts) -> Verdict | None:
    fact = f.persistence
    values = {k: s.value for k in fact.gpus() if (s := fact.first(k))}
    if not values:
        return Verdict.skip("nvidia-smi does not report Persistence Mode") if fact.known else None
    off = [k for k, v in values.items() if v.lower() == "disabled"]
    v = Verdict("pass", expected="Enabled on every GPU",
                observed=f"Disabled on {f.labels(off)}" if off else f"Enabled on {len(values)} of {len(fact.gpus())} GPUs")
    if off:
        v.status = "warn"
        v.reason = ("persistence mode off: the driver tears the GPU state down whenever no process holds it, so every CUDA "
                    "start (each rank, each nvidia-smi) pays the initialization again, and settings made with nvidia-smi "
                    "are lost")
        v.advice = "sudo nvidia-smi -pm 1 (or trainready check --fix); at boot: enable nvidia-persistenced"
    else:
        v.reason = "persistence mode on"
    if disagree := fact.disagreements(f.table):
        v.reason += "; sources disagree: " + "; ".join(disagree[:3])
    return v


@check("gpu.clocks", "gpu", needs=(SMI_Q,), gpu=True)
def application_clocks(f: Facts) -> Verdict | None:
    rows = settings(f)
    if not rows:
        return None
    low, seen = [], []
    for s in rows:
        pairs = [(s.app_graphics_mhz, s.default_app_graphics_mhz, "graphics"), (s.app_memory_mhz, s.default_app_memory_mhz, "memory")]
        for now, default, what in pairs:
            if now is None or default is None:
                continue
            seen.append(s.index)
            if now < default:
                low.append(f"GPU {s.index} {what} {now} of {default} MHz")
    if not seen:
        return Verdict.skip("application clocks not reported (N/A or deprecated on this GPU and driver)")
    sample = next(s for s in rows if s.index in seen)
    v = Verdict("pass", expected="application clocks at their defaults",
                observed="; ".join(low[:6]) if low else
                f"graphics {sample.app_graphics_mhz} MHz, memory {sample.app_memory_mhz} MHz (the defaults)")
    if low:
        v.status = "warn"
        v.reason = "application clocks set below their defaults (nvidia-smi -ac): every kernel runs slower"
        v.advice = "sudo nvidia-smi -rac (or trainready check --fix) resets them; locked clocks: sudo nvidia-smi -rgc"
    else:
        v.reason = "application clocks at their defaults (locked clocks, nvidia-smi -lgc, are not shown by -q)"
    return v


POWER_SLACK = 0.98  # a limit within 2% of the default is the default (boards round it)


def _w(watts: float) -> str:
    return f"{watts:.10g}"


def _compute_kept(f: Facts, limit: float) -> str:
    """What the planner's model says the cap costs (its rated power is the catalog's, as `estimate` takes it), where
    the GPU is known and the model covers the limit."""
    gpu = f.ctx.gpu
    if gpu is None:
        return ""
    try:
        kept = power_scale(gpu.arch, limit, gpu.power_w)
    except ValueError as exc:
        return f"; what that costs on {gpu.name} is not modelled ({exc})"
    return (f"; on {gpu.name} the planner's model keeps {kept:.0%} of the rated GEMM and attention speed at "
            f"{_w(limit)} W (trainready estimate --power-limit {_w(limit)})")


@check("gpu.power-limit", "gpu", needs=(SMI_Q,), gpu=True)
def power_limit(f: Facts) -> Verdict | None:
    rows = [s for s in settings(f) if s.power_limit_w is not None and s.power_default_w is not None]
    if not rows:
        return Verdict.skip("nvidia-smi -q reports no power limits (N/A, or the section was not captured)") \
            if settings(f) else None
    low = sorted((s for s in rows if s.power_limit_w < POWER_SLACK * s.power_default_w),
                 key=lambda s: s.power_limit_w / s.power_default_w)  # the most capped first: it sets the pace
    count = f"{len(rows)} GPU" + ("s" if len(rows) > 1 else "")
    at = sorted({(_w(s.power_limit_w), _w(s.power_default_w)) for s in rows})
    v = Verdict("pass", expected="each GPU's power limit in force at its default",
                observed="; ".join(f"GPU {s.index} {_w(s.power_limit_w)} of {_w(s.power_default_w)} W"
                                   for s in low[:6]) if low else
                f"{'; '.join(f'{a} W in force, default {d} W' for a, d in at[:3])} ({count})")
    if not low:
        v.reason = "every GPU may draw at least its default board power"
        return v
    v.status = "warn"
    platform = [s for s in low if s.power_requested_w is not None and s.power_requested_w > s.power_limit_w]
    by_pl = [s for s in low if s not in platform]
    parts, advice = [], []
    if platform:  # nvidia-smi asked for more than is in force: the driver's setting is not what holds it
        parts.append(f"GPU {gpus([s.index for s in platform])} held below the limit nvidia-smi asked for (GPU "
                     f"{platform[0].index}: {_w(platform[0].power_requested_w)} W asked, "
                     f"{_w(platform[0].power_limit_w)} W in force): the platform caps them (BMC or chassis power "
                     f"budget, a power-brake policy)")
        advice.append(f"GPU {gpus([s.index for s in platform])}: nvidia-smi -pl cannot lift it; ask the provider (or, "
                      f"on your own hardware, the BMC's GPU power capping setting) for the rated power, or plan with "
                      f"the cap")
    if by_pl:
        parts.append(f"GPU {gpus([s.index for s in by_pl])} set below their default power limit (nvidia-smi -pl)")
        advice.append(f"GPU {gpus([s.index for s in by_pl])}: sudo nvidia-smi -pl {_w(by_pl[0].power_default_w)} "
                      f"(per GPU: -i N) restores the default")
    v.reason = "; ".join(parts) + ": under tensor load their SM clocks drop" + _compute_kept(f, low[0].power_limit_w)
    v.advice = "; ".join(advice)
    return v


@check("gpu.vbios", "gpu", needs=(SMI_Q,), gpu=True)
def vbios(f: Facts) -> Verdict | None:
    rows = settings(f)
    versions = Counter(s.vbios for s in rows if s.vbios)
    if not versions:
        return Verdict.skip("nvidia-smi -q does not report VBIOS Version") if rows else None
    v = Verdict("pass", expected="one VBIOS version on every GPU",
                observed=", ".join(f"{ver} ({n} GPUs)" for ver, n in versions.most_common()))
    if len(versions) > 1:
        odd = [s.index for s in rows if s.vbios and s.vbios != versions.most_common(1)[0][0]]
        v.status = "fail"
        v.reason = (f"GPUs run different VBIOS versions (GPU {gpus(odd)} differ): a firmware update that did not "
                    "finish; Azure's node health checks fail such a node (check_vbios_version)")
        v.advice = "drain the node / stop-start the instance for other hardware; on your own hardware: update every GPU"
    else:
        v.reason = "every GPU runs the same VBIOS (gpu.driver checks the driver the same way)"
    return v


@check("gpu.gsp", "gpu", needs=(SMI_Q,), gpu=True)
def gsp(f: Facts) -> Verdict | None:
    rows = settings(f)
    if not rows:
        return None
    modes = Counter("off" if (s.gsp_firmware or "N/A").upper() == "N/A" else s.gsp_firmware for s in rows)
    observed = ", ".join(("GSP off" if m == "off" else f"GSP firmware {m}") + f" ({n} GPUs)" for m, n in modes.most_common())
    v = Verdict("pass", observed=observed, expected="one GSP mode on every GPU (noted, not judged)")
    if len(modes) > 1:
        v.status = "warn"
        v.reason = "GPUs differ in GSP firmware mode or version: a half-applied driver setting or upgrade"
        v.advice = "reboot after the driver change; NVreg_EnableGpuFirmware must be the same for every GPU"
    else:
        v.reason = ("the GPU System Processor runs the driver's firmware (the default on recent drivers; Xid 119/120 "
                    "are GSP timeouts)" if "off" not in modes else "GSP off: the driver runs on the CPU")
    return v


@check("gpu.mig", "gpu", needs=("mig",), gpu=True)
def mig(f: Facts) -> Verdict | None:
    fact, pending_fact = f.mig, f.mig_pending
    current = {k: s.value for k in fact.gpus() if (s := fact.first(k))}
    want = "MIG on (--mig)" if f.ctx.mig_expected else "MIG off on every GPU"
    if not fact.known:
        return None
    if not current:
        return Verdict("warn" if f.ctx.mig_expected else "pass", observed="MIG not supported (N/A)", expected=want,
                       reason="these GPUs have no MIG mode" + ("; --mig cannot apply" if f.ctx.mig_expected else ""))
    on = [k for k, v in current.items() if v.lower() == "enabled"]
    pending = [k for k in pending_fact.gpus() if (s := pending_fact.first(k)) and k in current and s.value != current[k]]
    v = Verdict("pass", expected=want,
                observed=f"MIG enabled on {f.labels(on)}" if on else f"MIG disabled on {len(current)} GPUs")
    if on and not f.ctx.mig_expected:
        v.status = "fail"
        v.reason = "MIG splits each GPU into isolated slices: a training process sees one slice, not the GPU"
        v.advice = "sudo nvidia-smi -mig 0, then reset the GPUs (nvidia-smi -r); pass --mig if slices are intended"
    elif f.ctx.mig_expected and len(on) < len(current):
        v.status, v.reason = "warn", "--mig says MIG is intended, but it is off on some GPUs"
        v.advice = "sudo nvidia-smi -mig 1 on them, then reset the GPUs"
    elif pending:
        v.status = "warn"
        v.reason = f"a MIG mode change on {f.labels(pending)} waits for a GPU reset"
        v.advice = "reset the GPUs (sudo nvidia-smi -r, or reboot) before training"
    else:
        v.reason = "MIG as intended"
    return v


@check("gpu.processes", "gpu", needs=("nvidia-smi-compute-apps.csv", SMI_Q), gpu=True)
def gpu_processes(f: Facts) -> Verdict | None:
    own = set(f.bundle.manifest.own_pids if f.bundle.manifest else [])
    apps = f.parsed("nvidia-smi-compute-apps.csv", node.parse_compute_apps)
    source = "nvidia-smi --query-compute-apps"
    if apps is None:
        apps = f.parsed(SMI_Q, node.parse_smi_q_processes)
        source = "nvidia-smi -q"
        if apps is not None and (why := f.unreadable(SMI_Q)):
            return Verdict("warn", reason=f"unreadable: {SMI_Q}: {why}", unverified=True)
    if apps is None:
        return missing(f, "nvidia-smi-compute-apps.csv")
    ps = f.parsed("ps.txt", node.parse_ps)
    owners = ps.by_pid() if ps is not None else {}
    others = [p for p in apps.processes if p.pid not in own]
    v = Verdict("pass", expected="no process on the GPUs before training",
                observed="none" if not others else "; ".join(_describe(p, owners) for p in others[:6]))
    if not others:
        v.reason = f"no GPU process ({source})" + (f"; {len(apps.processes)} of trainready's own" if apps.processes else "")
        return v
    v.observed = f"{len(others)} process(es): {v.observed}"
    if source == "nvidia-smi -q" and not own:
        v.status = "warn"
        v.reason = ("nvidia-smi -q lists processes on the GPUs; this bundle predates trainready's own-PID record, so one "
                    "of them may be its CUDA probe")
    else:
        v.status = "fail"
        v.reason = "processes hold GPUs: they take memory and compute from the training job (and may OOM it)"
    v.advice = "end them (kill PID; ask their owner) or wait for them; then check again"
    return v


def _describe(p: node.GpuProcess, owners: dict[int, node.PsEntry]) -> str:
    owner = owners.get(p.pid)
    parts = [p.name or (owner.command if owner else None) or "?"]
    if owner and owner.user:
        parts.append(f"user {owner.user}")
    if p.used_mib is not None:
        parts.append(f"{p.used_mib} MiB")
    if p.gpu:
        parts.append(f"on {p.gpu}")
    return f"PID {p.pid} ({', '.join(parts)})"
