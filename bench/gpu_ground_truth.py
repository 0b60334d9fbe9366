"""Measure memory and speed ground truth on a real GPU (run on a CUDA machine).

What it records, as JSON (``--out``), so the planner's memory and speed model can be held
to real numbers rather than to formulas alone:

* ``gemm``: bf16 matmul TFLOP/s for transformer-shaped GEMMs (tokens x d x n).
* ``attention``: causal FlashAttention (``scaled_dot_product_attention``) fwd+bwd TFLOP/s.
* ``steps``: real training steps of Llama-shaped models (Hugging Face ``LlamaForCausalLM``,
  ``attn_implementation="sdpa"``, random init, no download) at several micro-batches,
  sequence lengths, precisions, activation checkpointing, LoRA and FSDP2 (world size 1):
  ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` in the steady state and
  the measured step time.

It needs only torch (and transformers/peft for the HF model and LoRA rows). Each row is
independent: a failure is recorded and the next row runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback

import torch
import torch.nn.functional as F

GiB = 1024**3


def _sync_time(fn, warmup: int = 3, iters: int = 10) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


def bench_gemm() -> list[dict]:
    rows = []
    shapes = [(8192, 8192, 8192)]
    for d in (768, 2048, 4096, 8192):
        for tokens in (4096, 16384):
            # QKV-like, MLP up, MLP down (forward shapes: M=tokens, K, N)
            shapes += [(tokens, d, 3 * d), (tokens, d, 4 * d), (tokens, 4 * d, d)]
    for m, k, n in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        t = _sync_time(lambda a=a, b=b: a @ b)
        rows.append({"m": m, "k": k, "n": n, "seconds": t, "tflops": 2 * m * k * n / t / 1e12})
        del a, b
    return rows


def bench_attention() -> list[dict]:
    rows = []
    for head_dim in (64, 128):
        for seq in (1024, 2048, 4096, 8192):
            heads = 4096 // head_dim
            batch = max(1, 16384 // seq)
            q, k, v = (
                torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                            requires_grad=True)
                for _ in range(3)
            )

            def step(q=q, k=k, v=v):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.backward(torch.ones_like(out))

            t = _sync_time(step, warmup=2, iters=5)
            # causal: half of 4*b*h*s^2*hd forward; backward 2.5x forward (FlashAttention-2)
            flops = 3.5 * 4 * batch * heads * seq * seq * head_dim / 2
            rows.append({"head_dim": head_dim, "seq": seq, "batch": batch, "heads": heads,
                         "seconds": t, "tflops": flops / t / 1e12})
            del q, k, v
    return rows


def _llama(shape: dict, dtype: torch.dtype):
    if shape.get("arch") == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=shape["vocab"], n_embd=shape["d"], n_layer=shape["layers"],
                            n_head=shape["heads"], n_positions=shape.get("positions", 2048),
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                            attn_implementation="sdpa")
        with torch.device("cuda"):
            return GPT2LMHeadModel(config).to(dtype)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["d"], intermediate_size=shape["ffn"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], max_position_embeddings=8192,
        tie_word_embeddings=shape.get("tied", False), attention_bias=shape.get("bias", False),
        attn_implementation="sdpa", use_cache=False,
    )
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(dtype)
    return model


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def run_step_row(row: dict) -> dict:
    shape = row["shape"]
    mode = row["mode"]  # amp | pure_bf16 | lora | fsdp
    mb, seq = row["micro_batch"], row["seq"]
    model = None
    opt = None
    try:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        param_dtype = torch.float32 if mode in ("amp", "fsdp") else torch.bfloat16
        model = _llama(shape, param_dtype)
        n_params = _params(model)
        if row.get("checkpointing") == "full":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        trainable = None
        if mode == "lora":
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(
                r=row.get("lora_rank", 16), lora_alpha=32, lora_dropout=0.0,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                "down_proj"]))
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if mode == "fsdp":
            import torch.distributed as dist
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            if not dist.is_initialized():
                os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
                os.environ.setdefault("MASTER_PORT", "29512")
                dist.init_process_group("nccl", rank=0, world_size=1)
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            blocks = model.model.layers if hasattr(model, "model") else model.transformer.h
            for layer in blocks:
                fully_shard(layer, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
        ids = torch.randint(0, shape["vocab"], (mb, seq), device="cuda")
        use_autocast = mode == "amp"

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_autocast):
                out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()  # allocates optimizer state
        torch.cuda.synchronize()
        after_init = torch.cuda.memory_allocated()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        free, total = torch.cuda.mem_get_info()
        reserved_now = torch.cuda.memory_reserved()
        result = dict(row)
        result.update({
            "ok": True, "params": n_params, "trainable_params": trainable,
            "steady_allocated_gib": after_init / GiB,
            "max_allocated_gib": torch.cuda.max_memory_allocated() / GiB,
            "max_reserved_gib": torch.cuda.max_memory_reserved() / GiB,
            "device_used_gib": (total - free) / GiB,
            "outside_allocator_gib": (total - free - reserved_now) / GiB,
            "step_s": sorted(times)[len(times) // 2],
            "tokens_per_s": mb * seq / sorted(times)[len(times) // 2],
        })
        return result
    except Exception as exc:  # recorded, the next row still runs
        result = dict(row)
        result.update({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500],
                       "trace": traceback.format_exc()[-1500:]})
        return result
    finally:
        model = opt = None  # noqa: F841 (drop the references before collecting)
        gc.collect()
        torch.cuda.empty_cache()


SMALL = {"name": "llama-0.9b", "vocab": 32000, "d": 2048, "ffn": 5632, "layers": 16,
         "heads": 16, "kv_heads": 8}
SEVEN = {"name": "llama-2-7b", "vocab": 32000, "d": 4096, "ffn": 11008, "layers": 32,
         "heads": 32, "kv_heads": 32}


def step_rows() -> list[dict]:
    rows = []
    for mb in (1, 2, 4, 8):
        rows.append({"shape": SMALL, "mode": "amp", "micro_batch": mb, "seq": 2048})
    for seq in (1024, 4096):
        rows.append({"shape": SMALL, "mode": "amp", "micro_batch": 2, "seq": seq})
    for mb in (4, 16):
        rows.append({"shape": SMALL, "mode": "amp", "micro_batch": mb, "seq": 2048,
                     "checkpointing": "full"})
    for mb in (2, 8):
        rows.append({"shape": SMALL, "mode": "pure_bf16", "micro_batch": mb, "seq": 2048})
    rows.append({"shape": SMALL, "mode": "lora", "micro_batch": 4, "seq": 2048, "lora_rank": 16})
    rows.append({"shape": SMALL, "mode": "fsdp", "micro_batch": 4, "seq": 2048})
    rows.append({"shape": SEVEN, "mode": "pure_bf16", "micro_batch": 1, "seq": 4096})
    rows.append({"shape": SEVEN, "mode": "pure_bf16", "micro_batch": 4, "seq": 4096,
                 "checkpointing": "full"})
    rows.append({"shape": SEVEN, "mode": "lora", "micro_batch": 2, "seq": 4096, "lora_rank": 16})
    return rows


# Held out: measured after the model's efficiency factors were fixed, never used to set them.
LLAMA3_8B = {"name": "llama-3-8b", "vocab": 128256, "d": 4096, "ffn": 14336, "layers": 32, "heads": 32,
             "kv_heads": 8}
LLAMA32_3B = {"name": "llama-3.2-3b", "vocab": 128256, "d": 3072, "ffn": 8192, "layers": 28, "heads": 24,
              "kv_heads": 8, "tied": True}
QWEN_15B = {"name": "qwen2-1.5b", "vocab": 151936, "d": 1536, "ffn": 8960, "layers": 28, "heads": 12,
            "kv_heads": 2, "tied": True, "bias": True}
MISTRAL_7B = {"name": "mistral-7b", "vocab": 32000, "d": 4096, "ffn": 14336, "layers": 32, "heads": 32,
              "kv_heads": 8}
GPT2_13B = {"name": "gpt2-1.3b", "arch": "gpt2", "vocab": 50257, "d": 2048, "ffn": 8192, "layers": 24,
            "heads": 16, "kv_heads": 16, "positions": 2048}


def heldout_rows() -> list[dict]:
    return [
        {"shape": LLAMA3_8B, "mode": "pure_bf16", "micro_batch": 1, "seq": 4096},
        {"shape": LLAMA3_8B, "mode": "pure_bf16", "micro_batch": 2, "seq": 8192, "checkpointing": "full"},
        {"shape": QWEN_15B, "mode": "amp", "micro_batch": 4, "seq": 4096},
        {"shape": LLAMA32_3B, "mode": "fsdp", "micro_batch": 2, "seq": 4096},
        {"shape": MISTRAL_7B, "mode": "lora", "micro_batch": 1, "seq": 4096, "lora_rank": 8},
        {"shape": GPT2_13B, "mode": "amp", "micro_batch": 8, "seq": 2048},
        {"shape": GPT2_13B, "mode": "amp", "micro_batch": 16, "seq": 2048, "checkpointing": "full"},
    ]


def _isolated(which: str, index: int) -> dict:
    """Run one row in a fresh process: nothing (FSDP state, caches) carries into the next."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, __file__, "--one", which, str(index)], capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"ok": False, "error": (proc.stderr or proc.stdout)[-800:]}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        rows = step_rows() if sys.argv[2] == "calibration" else heldout_rows()
        print(json.dumps(run_step_row(rows[int(sys.argv[3])])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--skip-micro", action="store_true", help="only the training steps")
    parser.add_argument("--set", choices=("calibration", "heldout"), default="calibration",
                        help="which training-step rows to run")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure (this script is for a GPU machine)")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.ones(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    report = {
        "schema_version": 1,
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0),
        "gpu_total_gib": total / GiB,
        # memory the process holds outside PyTorch's caching allocator (CUDA context, cuBLAS)
        "context_gib": (total - free - torch.cuda.memory_reserved()) / GiB,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except ImportError:
        pass
    if not args.skip_micro:
        report["gemm"] = bench_gemm()
        print("gemm done", flush=True)
        report["attention"] = bench_attention()
        print("attention done", flush=True)
    report["steps"] = []
    report["set"] = args.set
    for index, row in enumerate(step_rows() if args.set == "calibration" else heldout_rows()):
        t0 = time.time()
        res = _isolated(args.set, index)
        res["shape"] = row["shape"]["name"]
        report["steps"].append(res)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
        print(json.dumps({k: v for k, v in res.items() if k != "trace"}), f"({time.time()-t0:.0f}s)",
              flush=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
