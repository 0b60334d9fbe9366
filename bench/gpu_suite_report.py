"""The GPU suite's report as the table docs/measurements.md keeps (bench/gpu_suite.py writes it): a pure function
of the suite's JSON report, apart so the suite's measuring code and its rendering each read in one sitting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MiB, GiB = 1 << 20, 1 << 30

# --- markdown ------------------------------------------------------------------------------------------------------
def _f(x: Any, digits: int = 0) -> str:
    """A figure for a table: `digits` decimals, or 3 significant digits where those would hide it (CPU)."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}" if abs(x) >= 10 ** (2 - digits) or x == 0 else f"{x:.3g}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def render_markdown(report: dict[str, Any]) -> str:
    h = report["host"]
    secs = report["sections"]
    lines = []
    if report["dry_run"]:
        lines += [f"### GPU suite dry run ({report['date']}, CPU)", "",
                  "**Dry run on CPU**: tiny shapes, a few iterations per row, gloo: it checks the code paths; "
                  "these figures say nothing about any GPU.", ""]
    else:
        smi = h.get("nvidia_smi") or {}
        mem = f"{smi['memory_total_mib']:,.0f} MiB" if smi.get("memory_total_mib") else f"{h.get('gpu_memory_gib', 0):.1f} GiB"
        extra = "".join([f", {smi['power_limit_w']:.0f} W limit" if smi.get("power_limit_w") else "",
                         f", {smi['max_sm_clock_mhz']:.0f} MHz max SM clock" if smi.get("max_sm_clock_mhz") else ""])
        lines += [f"### GPU suite: {h.get('gpu')} ({report['date']})", ""]
        lines += [f"`python bench/gpu_suite.py` on {report['date']}, one **{h.get('gpu')}** ({mem}, driver "
                  f"{h.get('driver') or h.get('cuda_driver_api', 'unknown')}{extra}, compute capability "
                  f"{h.get('capability')}), PyTorch {h['torch']}, CUDA {h['cuda']}, Python {h['python']}; "
                  f"{report['wall_s']:.0f} s in all.", ""]
    raw = Path(report.get("results_file", "gpu_suite.json"))
    raw_shown = raw.relative_to(ROOT) if raw.is_absolute() and raw.is_relative_to(ROOT) else raw
    lines += [f"Raw results: `{raw_shown}`. \"planner\": what `trainready "
              f"estimate` assumes here (efficiency.py's factor x the catalog's peak)"
              + (f" for {report['planner']['catalog_gpu']}." if report.get("planner") else
                 f": none ({report.get('planner_why') or 'GPU not in the catalog'})."), ""]

    def status(name: str) -> list[str]:
        s = secs[name]
        out = []
        if s.get("error"):
            out.append(f"*{name} failed:* `{s['error'][:300]}`")
        for e in s.get("errors", []):
            out.append(f"*failed:* {e['what']}: `{e['error'][:200]}`")
        for sk in s.get("skipped", []):
            out.append(f"*skipped:* {sk['what']}: {sk['reason']}")
        return [f"- {x}" for x in out] + ([""] if out else [])

    g = secs["gemm"]
    dense = [r for r in g["rows"] if "experts" not in r]
    lines += ["**GEMMs** (forward shapes M x K x N, TFLOP/s; FP8 = `torch._scaled_mm`, tensorwise scales):", "",
              "| model | GEMM | M x K x N | bf16 | planner | FP8 | planner FP8 |", "|---|---|---|---|---|---|---|"]
    keys = []
    for r in dense:
        key = (r["model"], r["gemm"], r["m"], r["k"], r["n"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        by = {r["dtype"]: r for r in dense if (r["model"], r["gemm"], r["m"], r["k"], r["n"]) == key}
        b, e = by.get("bf16", {}), by.get("fp8", {})
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} x {key[3]} x {key[4]} | {_f(b.get('tflops'))} | "
                     f"{_f(b.get('planner_tflops'))} | {_f(e.get('tflops'))} | {_f(e.get('planner_tflops'))} |")
    load = next((r.get("under_load") for r in dense if r.get("under_load")), None) or {}
    fields = ("sm_clock_mhz", "power_draw_w", "temperature_c", "clock_event_reasons")
    if any(load.get(f) is not None for f in fields):
        smi = h.get("nvidia_smi") or {}
        said = lambda x, unit: "not reported" if x is None else f"{x:,.0f} {unit}"  # noqa: E731 ([N/A] fields)
        cap = f" (max {smi['max_sm_clock_mhz']:.0f})" if smi.get("max_sm_clock_mhz") else ""
        limit = f" of its {smi['power_limit_w']:.0f} W limit" if smi.get("power_limit_w") else ""
        lines += ["", f"Under the sustained {dense[0]['gemm']} bf16 GEMM: SM clock "
                      f"{said(load.get('sm_clock_mhz'), 'MHz')}{cap}, power "
                      f"{said(load.get('power_draw_w'), 'W')}{limit}, temperature "
                      f"{said(load.get('temperature_c'), 'C')}, clock event reasons "
                      f"`{load.get('clock_event_reasons') or 'not reported'}`."]
    elif load.get("error"):
        lines += ["", f"Clocks under load: not read ({load['error'][:200]})."]
    grouped = [r for r in g["rows"] if "experts" in r]
    if grouped:
        lines += ["", "Experts' GEMMs (qwen3-30b-a3b: all experts of one layer, bf16, TFLOP/s):", "",
                  "| GEMM | experts x rows each x K x N | method | TFLOP/s | planner |", "|---|---|---|---|---|"]
        for r in grouped:
            lines.append(f"| {r['gemm']} | {r['experts']} x {r['rows_per_expert']} x {r['k']} x {r['n']} | "
                         f"{r['method']} | {_f(r['tflops'])} | {_f(r.get('planner_tflops'))} |")
    lines += [""] + status("gemm")

    a = secs["attention"]
    lines += ["**Attention** (causal SDPA forward + backward, bf16, TFLOP/s counting causal FLOPs, backward = "
              "2.5x forward):", "", "| seq | batch | heads (KV) x dim | TFLOP/s | planner |", "|---|---|---|---|---|"]
    for r in a["rows"]:
        lines.append(f"| {r['seq']:,} | {r['batch']} | {r['heads']} ({r['kv_heads']}) x {r['head_dim']} | "
                     f"{_f(r['tflops'])} | {_f(r.get('planner_tflops'))} |")
    lines += [""] + status("attention")

    r = secs["ring"]
    lines += ["**Ring attention**, one rank of a cp-way ring (torch's load-balanced context parallelism; compute and "
              "copies, no sends; TFLOP/s counting the rank's 1/cp of the causal FLOPs):", "",
              "| cp | seq | tokens per rank | forward s | backward s | TFLOP/s | planner |",
              "|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        lines.append(f"| {x['cp']} | {x['seq']:,} | {x['local_tokens']:,} | {x['forward_s']:.4f} | "
                     f"{x['backward_s']:.4f} | {_f(x['tflops'])} | {_f(x.get('planner_tflops'))} |")
    lines += [""] + status("ring")

    c = secs["copy"]
    lines += ["**Copies** (GB/s; D2D counted read + write):", "",
              "| direction | host memory | size | GB/s | planner |", "|---|---|---|---|---|"]
    for r in c["rows"]:
        lines.append(f"| {r['direction']} | {r['memory']} | {r['bytes'] / MiB:,.0f} MiB | {_f(r['gbps'], 1)} | "
                     f"{_f(r.get('planner_gbps'), 1)} |")
    lines += [""] + status("copy")

    t = secs["training"]
    lines += ["**Training run** through `trainready run` (torchrun, 1 process; steps timed in the script with CUDA "
              "events, host clocks on CPU; median after warm-up):", "",
              "| model | params | micro-batch x seq | tokens/s | telemetry tokens/s | MFU | peak alloc / reserved GiB "
              "| planner tokens/s | planner reserved GiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in t["rows"]:
        peak = (f"{r['max_allocated_gib']:.2f} / {r['max_reserved_gib']:.2f}" if r.get("max_reserved_gib")
                else f"RSS {r['peak_host_rss_gib']:.2f}" if r.get("peak_host_rss_gib") else "-")
        lines.append(f"| {r['model']} | {r['params'] / 1e6:,.1f}M | {r['micro_batch']} x {r['seq']} | "
                     f"{_f(r['tokens_per_s'])} | {_f(r.get('telemetry_tokens_per_s'))} | "
                     f"{_f(r.get('mfu'), 3)} | {peak} | {_f(r.get('planner_tokens_per_s'))} | "
                     f"{_f(r.get('planner_reserved_gib'), 2)} |")
    lines += [""] + status("training")

    k = secs["checkpoint"]
    lines += ["**Checkpoint** through `trainready.store.CheckpointManager` (DCP):", "",
              "| operation | GiB | seconds | GB/s | bit-exact |", "|---|---|---|---|---|"]
    for r in k["rows"]:
        exact = "yes" if r.get("bit_exact") else "-"
        lines.append(f"| {r['what']} | {r['bytes'] / GiB:.3f} | {r['seconds']:.3f} | {_f(r['gbps'], 2)} | {exact} |")
    lines += [""] + status("checkpoint")

    cal = report.get("calibration") or {}
    if cal.get("path"):
        lines += [f"Calibration fitted to these figures (`{Path(cal['path']).name}`): {cal['describe']}.", ""]
    elif cal.get("skipped") or cal.get("error"):
        lines += [f"Calibration: {cal.get('skipped') or 'failed: ' + cal['error']}.", ""]
    return "\n".join(lines).rstrip() + "\n"


# --- main --------------------------------------------------------------------------------------------------------
