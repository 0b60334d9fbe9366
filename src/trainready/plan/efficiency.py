"""The few efficiency factors the performance model uses, each with where it comes from.

Everything else in the model is physics: FLOPs and bytes counted from the shapes, divided
by the GPU's datasheet peaks. These factors say what fraction of a peak real kernels reach.
They are per GPU architecture, never per model or per measured run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchEfficiency:
    gemm: float
    """Fraction of dense peak a large bf16/fp16 GEMM sustains in training."""
    gemm_k0: float
    """GEMM efficiency ramps with the reduction dimension K as K / (K + gemm_k0)."""
    attention: float
    """Attention causal fwd+bwd with today's PyTorch SDPA kernels, head dim 128, long
    sequences: fraction of peak (see ATTENTION_KERNELS for other kernel generations)."""
    attention_s0: float
    """Attention efficiency ramps with sequence length as s / (s + attention_s0)."""
    attention_hd64: float
    """Multiplier for head dim <= 64 (fewer FLOPs per byte of Q/K/V)."""
    memory: float
    """Fraction of HBM bandwidth that elementwise kernels (norms, activations) reach."""
    source: str


ARCH = {
    # H200 measured on 2026-11-29 (bench/data/gpu_ground_truth_h200_2026-11-29.json):
    # transformer-shaped bf16 GEMMs 667-795 TFLOP/s (sustained large shapes ~0.72-0.78 of 989);
    # K=768 shapes 0.82x and K=3072 0.95x of large-K ones -> K/(K+170). SDPA causal fwd+bwd:
    # hd128 290/396/487/546 TFLOP/s at s=1k/2k/4k/8k = 0.63 * s/(s+1200); hd64 0.78x of that.
    "hopper": ArchEfficiency(gemm=0.75, gemm_k0=170, attention=0.63, attention_s0=1200,
                             attention_hd64=0.78, memory=0.80,
                             source="measured on H200 (torch 2.11, CUDA 13), 2026-11-29"),
    # A100: cuBLAS bf16 sustains ~270 of 312 TFLOP/s on large shapes (0.86); FlashAttention-2
    # paper (Dao 2023, Fig. 4, A100 80GB, causal fwd+bwd): ~190 TFLOP/s at hd128 for long
    # sequences, ~170 at 2k, lower for hd64.
    "ampere": ArchEfficiency(gemm=0.86, gemm_k0=128, attention=0.62, attention_s0=700,
                             attention_hd64=0.85, memory=0.80,
                             source="cuBLAS A100 GEMM reports; FlashAttention-2 paper, Fig. 4"),
    # Blackwell: not measured here; Hopper's fractions assumed.
    "blackwell": ArchEfficiency(gemm=0.75, gemm_k0=170, attention=0.63, attention_s0=1200,
                                attention_hd64=0.78, memory=0.80,
                                source="assumed equal to Hopper (not measured)"),
    # Ada (L4, L40S): power-limited parts sustain a lower fraction of their tensor peak.
    "ada": ArchEfficiency(gemm=0.70, gemm_k0=128, attention=0.50, attention_s0=700,
                          attention_hd64=0.85, memory=0.80,
                          source="assumed (no public training measurement in our references)"),
    # V100: no FlashAttention-2 (memory-efficient attention instead), fp16 tensor cores.
    "volta": ArchEfficiency(gemm=0.75, gemm_k0=128, attention=0.35, attention_s0=700,
                            attention_hd64=0.85, memory=0.80,
                            source="assumed (no public training measurement in our references)"),
    "other": ArchEfficiency(gemm=0.70, gemm_k0=128, attention=0.45, attention_s0=700,
                            attention_hd64=0.85, memory=0.75, source="assumed"),
}

# Attention kernels by generation, causal fwd+bwd at head dim 128 on long sequences, as a
# fraction of the A100's bf16 peak (FlashAttention-2 paper, Fig. 4, A100: FlashAttention-1
# and Triton ~100 TFLOP/s, FlashAttention-2 ~190). Kernels written for Ampere run on Hopper
# without its new instructions: they scale with SM count x clock (132 x 1.98 GHz vs
# 108 x 1.41 GHz = 1.72x), e.g. FlashAttention-2 ~333 TFLOP/s on H100 as its paper reports.
# "sdpa" is PyTorch's scaled_dot_product_attention today: FlashAttention-2 on Ampere,
# Hopper-native kernels on Hopper (measured above).
ATTENTION_KERNELS = {"flash1": 0.33, "flash2": 0.62}
AMPERE_KERNEL_SPEEDUP = {"hopper": 1.72, "blackwell": 1.72}
A100_PEAK_TFLOPS = 312.0

# Eager PyTorch runs each norm, activation, cast and residual add as its own small kernel,
# with dtype round trips: on the H200 runs of Hugging Face Llama (pure bf16 and AMP, 0.9B
# and 7B) the time not explained by GEMMs, attention and the optimizer matches the counted
# elementwise bytes moving at 0.35-0.42 of HBM bandwidth (vs ~0.8 for fused kernels).
EAGER_MEMORY_EFFICIENCY = 0.38

# Host-side time to issue one transformer block's kernels (forward + backward) from eager
# PyTorch. It bounds small micro-batches: a step is never faster than the CPU can launch
# it. Eager (Hugging Face style modules, many small kernels) calibrated on the H200 run of
# a 16-layer 0.9B Llama at micro-batch 1 (77 ms per step, GPU-side work ~20 ms). Fused
# stacks (Megatron, llm-foundry, torch.compile) issue about a third as many kernels.
CPU_S_PER_LAYER = {"eager": 4.0e-3, "fused": 1.5e-3}

# Collective bandwidth as a fraction of the link's per-direction bandwidth. NVLink:
# nccl-tests all-reduce busbw ~230 GB/s on 8x A100 (300 GB/s per direction) -> 0.8.
# Network: 2x p4de over EFA reaches ~78 GB/s busbw where the node NICs allow 93.75 -> 0.83.
# PCIe-only boxes route rings through the CPU (PXB/NODE/SYS): about half of the x16 link.
NVLINK_EFFICIENCY = 0.80
NETWORK_EFFICIENCY = 0.83
PCIE_P2P_EFFICIENCY = 0.50
COLLECTIVE_LATENCY_S = 20e-6
"""Fixed cost per collective call (kernel launch, protocol handshakes)."""
RING_STEP_LATENCY_S = 1e-6
"""Added per rank in a ring (latency term of large collectives)."""

# Share of overlapped communication time that still slows compute: NCCL kernels take SMs
# and HBM bandwidth while they run beside the GEMMs, and FSDP's per-unit copies and waits
# sit on the compute stream. Set on the MosaicML A100 rows only (sweep 0.15..1.0: 0.5 gives
# the lowest 90th-percentile error there); the H100 rows were held out and agree.
OVERLAP_CONTENTION = 0.5

# Host memory bandwidth a CPU optimizer step (DeepSpeed CPU-Adam) reaches per node, and the
# fraction of a GPU's PCIe link that pinned host<->device copies reach.
HOST_OPTIMIZER_GBPS = 150.0
PCIE_COPY_EFFICIENCY = 0.80

# Memory outside the tensors: allocator fragmentation (max_memory_reserved over
# max_memory_allocated, median over the H200 runs: 1.05 for DDP/single GPU, 1.19 for
# FSDP2 whose all-gather buffers live on another stream), CUDA context + cuBLAS workspace
# (0.75-0.82 GiB measured on H200 with CUDA 13), and NCCL's own buffers when ranks > 1.
FRAGMENTATION = {"default": 0.05, "zero3": 0.15}
CUDA_CONTEXT_GIB = 0.8
NCCL_BUFFERS_GIB = 0.5
