"""Stacks, selective checkpointing kinds, QLoRA and CPU-Adam offload against published runs.

Prints, with the published figure beside each estimate:
* torchtitan's Llama 3.1 8B FSDP rows (benchmarks/llama3_h100_202412_torchtitan.md, Tables 1
  and 3: 8 and 128 H100, local batch 2, seq 8192, selective op AC, no torch.compile): peak
  memory (torchtitan logs max_reserved) and tokens/s/GPU, with "selective" read as Megatron's
  attention recompute (what trainready did before stacks) and as torchtitan's op policy. Their
  H100s are 96 GB HBM2e parts at 500 W (2.4 TB/s; peak "between SXM and NVL"): estimated on
  h100-80gb (SXM, 3.35 TB/s), so tokens/s are expected somewhat above the measurement.
* LoRA vs QLoRA (bnb.nf4-dq) on LitGPT's resource tables (tutorials/resource-tables.md,
  2023-10-20: A100-SXM4-40GB, micro-batch 1, Alpaca: the sequence length is the sample's, shown
  at 256 and 512 tokens).
* The CPU optimizer step of a 69B model with optimizer offload on one node, by host memory
  bandwidth (150 GB/s, the model before) and by CPU-Adam's per-core rate.

Usage: python bench/stack_checks.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from trainready.catalog import load_catalog  # noqa: E402
from trainready.plan.job import JobSpec  # noqa: E402
from trainready.plan.memory import GiB, estimate_memory, param_counts  # noqa: E402
from trainready.plan.performance import cpu_adam_s, estimate_step, host_cpu_cores  # noqa: E402
from trainready.plan.setup import resolve  # noqa: E402

CATALOG = load_catalog()
TORCHTITAN = [  # (GPUs, tokens/s/GPU, memory GiB): Tables 1 and 3, "FSDP" rows
    (8, 5762, 82.4), (128, 5605, 67.0)]
LITGPT = [  # (model, LoRA min/1k iterations, bnb.nf4-dq min/1k iterations)
    ("llama-2-7b", 2.36, 3.83), ("llama-2-13b", 3.19, 6.55)]


def ape(pred: float, meas: float) -> str:
    return f"{(pred / meas - 1) * 100:+5.0f}%"


def torchtitan() -> None:
    print("torchtitan Llama 3.1 8B, FSDP, local batch 2, seq 8192, selective op AC (H100)")
    print(f"  {'GPUs':>4} {'selective as':15} {'reserved GiB':>13} {'meas':>6} {'err':>6}  {'tok/s/GPU':>9} "
          f"{'meas':>6} {'err':>6}")
    for gpus, tps, mem in TORCHTITAN:
        for kind in ("selective-attn", "selective-op"):
            job = JobSpec(model="llama-3.1-8b", gpu="h100-80gb", gpus=gpus, gpus_per_node=8, inter_node_gbps=3200,
                          strategy="fsdp", micro_batch=2, global_batch=2 * gpus, seq_len=8192, precision="bf16",
                          stack="torchtitan", activation_checkpointing=kind)
            s = resolve(job, CATALOG)
            m = estimate_memory(s).reserved_peak / GiB
            t = estimate_step(s).tokens_per_s / s.n_gpus
            print(f"  {gpus:4d} {kind:15} {m:13.1f} {mem:6.1f} {ape(m, mem)}  {t:9.0f} {tps:6d} {ape(t, tps)}")


def qlora() -> None:
    print("\nLoRA vs QLoRA (bnb.nf4-dq), LitGPT resource tables, 1x A100-40GB, micro-batch 1")
    print(f"  {'model':12} {'seq':>4} {'pred slowdown':>14} {'measured':>9}")
    for model, lora_min, qlora_min in LITGPT:
        for seq in (256, 512):
            step = {}
            for method in ("lora", "qlora"):
                job = JobSpec(model=model, gpu="a100-40gb", gpus=1, strategy="ddp", micro_batch=1, global_batch=1,
                              seq_len=seq, method=method, lora_rank=8, precision="bf16", optimizer_dtype="bf16")
                step[method] = estimate_step(resolve(job, CATALOG)).step_s
            print(f"  {model:12} {seq:4d} {ape(step['qlora'], step['lora']):>14} "
                  f"{ape(qlora_min, lora_min):>9}")


def cpu_adam() -> None:
    print("\nCPU optimizer step, llama-2-70b, tp 8, ZeRO-2, optimizer offload, one node")
    for inst in ("p4d.24xlarge", "p5.48xlarge"):
        job = JobSpec(model="llama-2-70b", instance=inst, tp=8, strategy="zero2", offload="optimizer", micro_batch=1)
        s = resolve(job, CATALOG)
        node = param_counts(s).trainable / s.dp * s.gpus_per_node
        cores, _ = host_cpu_cores(s)
        print(f"  {inst:14} {node / 1e9:5.1f}B params: by 150 GB/s host bandwidth {node * 30 / 150e9:5.1f} s, "
              f"by CPU-Adam per core ({cores} cores) {cpu_adam_s(s, node):6.1f} s")


def main() -> None:
    print(__doc__.split("Usage:")[0].strip().split("\n\n", 1)[1])
    print()
    torchtitan()
    qlora()
    cpu_adam()


if __name__ == "__main__":
    main()
