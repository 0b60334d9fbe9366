"""What torch sees (cuda.json, written by a separate process so a broken driver cannot take the
checker down): CUDA available, how many GPUs, and whether CUDA graphs capture and replay."""

from __future__ import annotations

from ..facts import Facts
from ..registry import Verdict, check
from .common import presence

TORCH_ADVICE = "pip install 'trainready[torch]' (or your own CUDA build of torch)"


@check("cuda.runtime", "cuda", needs=("cuda.json",))
def cuda_runtime(f: Facts) -> Verdict | None:
    data, ctx = f.cuda, f.ctx
    if "unparsable" in data:
        return Verdict("warn", reason=f"unreadable: cuda.json: {data['unparsable']!r}", unverified=True,
                       advice="collect the bundle again: trainready check collect --out DIR")
    if not data.get("torch"):
        return Verdict.skip("torch is not installed", TORCH_ADVICE)
    seen = presence(f).count
    expected = seen or ctx.gpu_count
    if not data.get("cuda_available"):
        observed = f"torch {data['torch']}: CUDA not available"
        if seen == 0:  # no GPU at all: one root cause, reported by gpu.count
            return Verdict.skip("CPU-only node (--cpu-only): CUDA not needed" if ctx.cpu_only else
                                "no GPU visible: see gpu.count", observed=observed, expected="a GPU")
        if f.fabric_not_ready:
            return Verdict("fail", observed=observed, expected=f"torch sees {expected} GPUs" if expected else "a GPU",
                           reason="CUDA is not initialized (error 802): the NVSwitch fabric is not ready, see nvswitch.fabric",
                           advice="fix nvswitch.fabric first")
        if not expected:
            return Verdict.skip(f"{data.get('reason', 'CUDA not available')}; GPU count unknown (see gpu.count)",
                                observed=observed)
        return Verdict("fail", observed=observed, expected=f"torch sees {expected} GPUs", reason=data.get("reason", ""),
                       advice="install a CUDA build of torch matching the driver")
    count = data.get("device_count", 0) if isinstance(data.get("device_count"), int) else 0
    want = ctx.gpu_count or seen
    lost = len(f.inventory.lost)
    v = Verdict("pass", observed=f"torch {data['torch']} sees {count} GPUs", expected=ctx.expect(f"{want} GPUs"))
    if want and count < want:
        v.status, v.reason = "fail", f"torch sees {count} of {want} GPUs"
        v.advice = "check CUDA_VISIBLE_DEVICES and the container's --gpus setting"
        if lost and want - count <= lost:
            v.lost = "only"
    else:
        v.reason = "torch sees every GPU"
    return v


@check("cuda.graphs", "cuda", needs=("cuda.json",), gpu=True)
def cuda_graphs(f: Facts) -> Verdict | None:
    data = f.cuda
    graphs = data.get("graphs") if isinstance(data.get("graphs"), dict) else None
    if not graphs:
        return Verdict.skip("CUDA not available: see cuda.runtime" if data and not data.get("cuda_available") else
                            "no CUDA device to capture on")
    if graphs.get("ok"):
        diff = graphs.get("max_abs_diff", 0)
        return Verdict("pass", observed="captured and replayed; result matches eager", expected="capture + replay == eager",
                       reason=f"max abs diff {diff:.2e}" if isinstance(diff, (int, float)) else "")
    return Verdict("fail", observed=str(graphs.get("error", "replay differs from eager"))[:300],
                   expected="capture + replay == eager",
                   reason="CUDA graphs broken: torch.compile(mode='reduce-overhead') and CUDA-graph NCCL paths will fail",
                   advice="update the driver / torch build pair")
