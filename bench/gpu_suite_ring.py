"""The GPU suite's ``ring`` section: one rank's share of context-parallel ring attention, on one GPU.

Why: the planner is 38-70% optimistic on torchtitan's published context-parallel runs (CP 2-8, 64k-256k tokens,
bench/plan_accuracy_2024.py), and its per-rank attention time is the one part of those runs no source measures.
This section times what rank r of a cp-way ring computes, without the sends, as torch's load-balanced ring
(torch.distributed.tensor.experimental context parallelism, torch 2.6 to 2.13: ``_templated_ring_attention`` and
its backward, default options) runs it over FlashAttention-2, SDPA's flash kernel: the path of the published
torchtitan CP runs (torch 2.6); from torch 2.11 SDPA picks cuDNN on Hopper and Blackwell (plan/stacks.py), whose
ring runs the same steps over cuDNN's kernel, not timed here:

- the rank holds 2 chunks of the sequence (round-robin load balancing), ``local = seq / cp`` tokens;
- step 0: causal attention of its queries over its own keys and values;
- steps 1 .. cp-1: keys and values of another rank; for i <= r, all queries against the first half of them, for
  i > r, the second half of the queries against all of them (no mask);
- forward: each step's output and log-sum-exp merged into fp32 accumulators (the numerically stable sigmoid /
  log-sigmoid update), the half-steps' results written back by concatenation, as torch does, and before each of
  the cp - 1 sends the key and value chunks concatenated into one buffer;
- backward: FlashAttention's backward per step with the merged output and log-sum-exp (the key and value chunks
  concatenated for their next send, as forward), query gradients added in place into fp32, key/value gradients
  added in place to the fp32 buffer received from the previous rank and concatenated into one buffer for the
  next send (the copies stay, the sends do not).

Keys and values are expanded to the query heads (what torchtitan's Llama handed SDPA in 2024, and what the flash
op takes); the FLOPs are the same as grouped-query attention's. Counted FLOPs: the rank's 1/cp share of the whole
sequence's causal attention, backward 2.5x forward, so TFLOP/s compares with the ``attention`` section's rows and
with the planner's: FlashAttention-2 (torch's flash kernel, what these calls run) on a chunk of ``local`` tokens,
what plan/performance.py assumes for every rank of a context-parallel run on a stack that uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Timer = Callable[[Callable[[], Any]], float]


def flash_ops(cuda: bool):
    """(forward, backward) of FlashAttention as aten exposes it: forward(q, k, v, causal) -> (out, lse, ctx),
    backward(grad, q, k, v, out, lse, causal, ctx) -> (dq, dk, dv). CUDA: the flash kernels; CPU (the dry run):
    aten's CPU flash implementation, the same interface."""
    if cuda:
        def forward(q, k, v, causal):
            out, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, causal)
            return out, lse, (cq, ck, mq, mk, seed, offset)

        def backward(grad, q, k, v, out, lse, causal, ctx):
            cq, ck, mq, mk, seed, offset = ctx
            return torch.ops.aten._scaled_dot_product_flash_attention_backward(
                grad, q, k, v, out, lse, cq, ck, mq, mk, 0.0, causal, seed, offset)
    else:
        def forward(q, k, v, causal):
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
            return out, lse, None

        def backward(grad, q, k, v, out, lse, causal, ctx):
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, q, k, v, out, lse, 0.0, causal)
    return forward, backward


def steps(rank: int, cp: int) -> list[tuple[str, str, bool]]:
    """(queries, keys/values, causal) of each ring step on `rank`: "all", "first" or "second" half."""
    out = [("all", "all", True)]
    for i in range(1, cp):
        out.append(("all", "first", False) if i <= rank else ("second", "all", False))
    return out


def _half(x: torch.Tensor, part: str) -> torch.Tensor:
    if part == "all":
        return x
    first, second = x.chunk(2, dim=2)
    return first if part == "first" else second


def _put_half(whole: torch.Tensor, part: str, value: torch.Tensor) -> torch.Tensor:
    """`whole` with its `part` replaced by `value`: a new tensor, by concatenation (torch's merge of a half-step)."""
    if part == "all":
        return value
    first, second = whole.chunk(2, dim=2)
    return torch.cat([value, second] if part == "first" else [first, value], dim=2)


def _add_half(whole: torch.Tensor, part: str, value: torch.Tensor) -> torch.Tensor:
    """`whole` with `value` added to its `part`, as torch accumulates gradients: in place, and for a half the two
    halves concatenated afterwards (its partial update)."""
    if part == "all":
        whole += value
        return whole
    _half(whole, part).add_(value)
    return torch.cat(whole.chunk(2, dim=2), dim=2)


class RingRank:
    """One rank's inputs and its forward / backward, as module docstring says."""

    def __init__(self, local: int, heads: int, head_dim: int, rank: int, cp: int, device: str):
        shape = (1, heads, local, head_dim)
        make = lambda: torch.randn(shape, device=device, dtype=torch.bfloat16)  # noqa: E731
        self.q, self.k, self.v = make(), make(), make()
        self.k_other, self.v_other = make(), make()  # another rank's chunk (its values do not matter)
        self.grad = make()
        self.plan = steps(rank, cp)
        self.fwd_op, self.bwd_op = flash_ops(device == "cuda")

    def _kv(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.k, self.v) if i == 0 else (self.k_other, self.v_other)

    def _send_kv(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Torch concatenates the chunk it passes on into one buffer before each send but the last."""
        if i < len(self.plan) - 1:
            torch.cat([k.flatten(), v.flatten()])

    def forward(self) -> tuple[torch.Tensor, torch.Tensor, list]:
        out = lse = None
        ctxs = []
        for i, (q_part, kv_part, causal) in enumerate(self.plan):
            k, v = self._kv(i)
            self._send_kv(i, k, v)
            o, l_b, ctx = self.fwd_op(_half(self.q, q_part), _half(k, kv_part), _half(v, kv_part), causal)
            ctxs.append(ctx)
            o, l_b = o.float(), l_b.float().unsqueeze(-1)
            if out is None:
                out, lse = o, l_b
                continue
            cur_o, cur_l = _half(out, q_part), _half(lse, q_part)
            new_o = cur_o - torch.sigmoid(l_b - cur_l) * (cur_o - o)
            new_l = cur_l - F.logsigmoid(cur_l - l_b)
            out, lse = _put_half(out, q_part, new_o), _put_half(lse, q_part, new_l)
        return out.to(self.q.dtype), lse.squeeze(-1), ctxs  # torch gives the output back in the inputs' dtype

    def backward(self, out: torch.Tensor, lse: torch.Tensor, ctxs: list) -> tuple[torch.Tensor, ...]:
        """(dq, dk, dv) of this rank's chunks in the inputs' dtype (dk and dv as the last send carries them on)."""
        dq = torch.zeros_like(self.q, dtype=torch.float32)
        dk = torch.zeros_like(self.k, dtype=torch.float32)
        dv = torch.zeros_like(self.v, dtype=torch.float32)
        sent = None
        for i, (q_part, kv_part, causal) in enumerate(self.plan):
            k, v = self._kv(i)
            self._send_kv(i, k, v)
            gq, gk, gv = self.bwd_op(_half(self.grad, q_part), _half(self.q, q_part), _half(k, kv_part),
                                     _half(v, kv_part), _half(out, q_part), _half(lse, q_part).contiguous(), causal,
                                     ctxs[i])
            if i > 0:  # the key/value gradients that arrived from the previous rank, added to
                dk, dv = sent[:dk.numel()].view_as(dk), sent[dk.numel():].view_as(dv)
            dk, dv = _add_half(dk, kv_part, gk), _add_half(dv, kv_part, gv)
            sent = torch.cat([dk.flatten(), dv.flatten()])  # the buffer the next send would carry
            dq = _add_half(dq, q_part, gq)
        sent = sent.to(self.k.dtype)
        return dq.to(self.q.dtype), sent[:dk.numel()].view_as(self.k), sent[dk.numel():].view_as(self.v)


def _time_rank(rank: RingRank, timer: Timer) -> tuple[float, float]:
    """(forward s, backward s) of `rank`; its tensors go when this returns."""
    fwd_s = timer(rank.forward)
    out, lse, ctxs = rank.forward()
    return fwd_s, timer(lambda: rank.backward(out, lse, ctxs))


def bench_ring(sec: dict[str, Any], clock, cps: tuple[int, ...], local: int, heads: int, head_dim: int, cuda: bool,
               timer: Timer, attention_flops: Callable[[int, int, int, int], float],
               planner_attention: Callable[[int, int], float | None], peak_bf16: float | None,
               error: Callable[[BaseException], str], free: Callable[[], None]) -> None:
    """Rows of `sec` for each cp in `cps`: rank cp // 2 of a sequence of cp x `local` (both kinds of half-step
    from cp 3 on; at cp 2 its one step uses the first half of the other rank's keys and values)."""
    sec["notes"].append(f"one rank of a cp-way load-balanced ring (torch's context parallelism), {local:,} tokens "
                        f"per rank, {heads} heads x {head_dim}, bf16 with fp32 merges and gradient buffers; "
                        "the sends are left out (one GPU): the figure is the rank's compute and its copies")
    device = "cuda" if cuda else "cpu"
    for cp in cps:
        seq = cp * local
        what = f"cp {cp}, seq {seq}"
        if clock.out():
            sec["skipped"].append({"what": what, "reason": f"section time budget ({clock.budget_s:.0f} s) reached"})
            continue
        try:
            fwd_s, bwd_s = _time_rank(RingRank(local, heads, head_dim, cp // 2, cp, device), timer)
            flops = attention_flops(1, heads, seq, head_dim) / cp
            row = {"cp": cp, "seq": seq, "local_tokens": local, "rank": cp // 2, "heads": heads, "head_dim": head_dim,
                   "forward_s": fwd_s, "backward_s": bwd_s, "seconds": fwd_s + bwd_s,
                   "tflops": flops / (fwd_s + bwd_s) / 1e12, "backward_over_forward": bwd_s / fwd_s}
            pred = planner_attention(local, head_dim)  # the planner's flash2 figure on a rank's chunk
            if pred and peak_bf16:
                row["planner_tflops"] = pred
                row["fraction_of_peak"] = row["tflops"] / peak_bf16
            sec["rows"].append(row)
        except Exception as exc:
            sec["errors"].append({"what": what, "error": error(exc)})
        free()
