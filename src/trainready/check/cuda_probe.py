"""`python -m trainready.check.cuda_probe`: what torch sees, as JSON on stdout (a separate
process, so a broken driver cannot take the checker down). Without torch or CUDA it says so."""

from __future__ import annotations

import json
import sys


def probe() -> dict:
    try:
        import torch
    except ImportError:
        return {"torch": None, "cuda_available": False, "reason": "torch is not installed"}
    import warnings

    with warnings.catch_warnings(record=True) as caught:  # torch words CUDA init errors (802 ...) as warnings
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    out: dict = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "cuda_available": available}
    said = [str(w.message)[:500] for w in caught if "CUDA" in str(w.message)][:4]
    if said:
        out["warnings"] = said
    if not out["cuda_available"]:
        out["reason"] = "torch.cuda.is_available() is False" + ("" if torch.version.cuda else " (CPU-only torch build)")
        return out
    out["device_count"] = torch.cuda.device_count()
    out["devices"] = [torch.cuda.get_device_name(i) for i in range(out["device_count"])]
    out["graphs"] = _graph_test(torch)
    return out


def _graph_test(torch) -> dict:
    """Capture a small graph, replay it on new input, compare with eager."""
    try:
        x = torch.randn(256, 256, device="cuda")
        w = torch.randn(256, 256, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up on a side stream, as capture requires
                torch.relu(x @ w)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = torch.relu(x @ w)
        x.copy_(torch.randn(256, 256, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.relu(x @ w)
        ok = bool(torch.allclose(y, expected, rtol=1e-3, atol=1e-3))
        return {"ok": ok, "max_abs_diff": float((y - expected).abs().max())}
    except Exception as exc:  # a capture failure is the finding
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}


if __name__ == "__main__":
    json.dump(probe(), sys.stdout)
    sys.stdout.write("\n")
