"""A Llama-shaped model (RMSNorm, RoPE, GQA through SDPA, SwiGLU, untied head) trained on random tokens
for a few steps with the trainready session API; launched by bench/gpu_suite.py through `trainready run`. Each step is
timed with CUDA events (host clocks on CPU); rank 0 writes what it measured to --result."""
import argparse, json, os, resource, statistics, time

import torch
import torch.nn as nn
import torch.nn.functional as F

import trainready
from trainready.plan.model_spec import ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.h, self.kv, self.hd = a.heads, a.kv_heads, a.d // a.heads
        self.norm1, self.norm2 = RMSNorm(a.d), RMSNorm(a.d)
        self.q = nn.Linear(a.d, self.h * self.hd, bias=False)
        self.k = nn.Linear(a.d, self.kv * self.hd, bias=False)
        self.v = nn.Linear(a.d, self.kv * self.hd, bias=False)
        self.o = nn.Linear(self.h * self.hd, a.d, bias=False)
        self.gate = nn.Linear(a.d, a.ffn, bias=False)
        self.up = nn.Linear(a.d, a.ffn, bias=False)
        self.down = nn.Linear(a.ffn, a.d, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        y = self.norm1(x)
        q = self.q(y).view(b, s, self.h, self.hd).transpose(1, 2)
        k = self.k(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = self.v(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.kv == self.h:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            try:
                att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            except TypeError:  # an older torch
                rep = self.h // self.kv
                att = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                     is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, s, -1))
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.d)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.d)
        self.head = nn.Linear(a.d, a.vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, cos, sin):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def rope(seq, hd, device, dtype):
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None, None].to(dtype), emb.sin()[None, None].to(dtype)


def main():
    ap = argparse.ArgumentParser()
    for name in ("d", "layers", "heads", "kv-heads", "ffn", "vocab", "seq", "batch", "steps", "warmup"):
        ap.add_argument(f"--{name}", type=int, required=True)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--result", required=True)
    a = ap.parse_args()
    spec = ModelSpec(name="llama-suite", family="llama", vocab_size=a.vocab, hidden_size=a.d, num_layers=a.layers,
                     num_heads=a.heads, num_kv_heads=a.kv_heads, ffn_hidden_size=a.ffn)
    sess = trainready.init(total_steps=a.steps, model=spec, seq_len=a.seq)
    dev = sess.device
    cuda = dev.type == "cuda"
    if not cuda:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    with torch.device(dev):  # built on the device: no multi-GB fp32 copy on the host first
        model = Llama(a).to(dtype)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if cuda else {}))
    cos, sin = rope(a.seq, a.d // a.heads, dev, dtype)
    gen = torch.Generator(device=dev).manual_seed(1)
    tokens = a.batch * a.seq
    if cuda:  # the peaks from here: the fp32 build above and its cached blocks do not count
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    marks, host, losses = [], [], []
    for step in range(sess.start_step, a.steps):
        with sess.step(tokens=tokens) as t:
            ids = t.data(torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev, generator=gen))
            h0 = time.perf_counter()
            if cuda:
                e0 = torch.cuda.Event(enable_timing=True)
                e0.record()
            logits = model(ids[:, :-1], cos, sin)
            loss = F.cross_entropy(logits.float().view(-1, a.vocab), ids[:, 1:].reshape(-1))
            loss.backward()
            with t.optimizer():
                opt.step()
                opt.zero_grad(set_to_none=True)
            if cuda:
                e1 = torch.cuda.Event(enable_timing=True)
                e1.record()
                marks.append((e0, e1))
            value = loss.item()
            host.append(time.perf_counter() - h0)
            losses.append(value)
            t.log(loss=value)
    if cuda:
        torch.cuda.synchronize()
        times = [e0.elapsed_time(e1) / 1000.0 for e0, e1 in marks]
    else:
        times = host
    sess.finish()
    steady = times[a.warmup:] or times
    step_s = statistics.median(steady)
    result = {"params": params, "tokens_per_step": tokens, "steps": len(times), "warmup": a.warmup,
              "timing": "cuda-events" if cuda else "host", "step_s": step_s, "tokens_per_s": tokens / step_s,
              "step_times_s": times, "loss_first": losses[0] if losses else None,
              "loss_last": losses[-1] if losses else None, "dtype": a.dtype, "device": str(dev)}
    if cuda:
        result.update(max_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                      max_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
                      gpu=torch.cuda.get_device_name())
    else:
        result["peak_host_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    if sess.is_main:
        tmp = a.result + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(result, fh)
        os.replace(tmp, a.result)


if __name__ == "__main__":
    main()
