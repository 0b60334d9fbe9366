"""The few efficiency factors the performance model uses, each with where it comes from.

Everything else in the model is physics: FLOPs and bytes counted from the shapes, divided
by the GPU's datasheet peaks. These factors say what fraction of a peak real kernels reach.
They are per GPU architecture, never per model or per measured run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Confidence = Literal["measured", "published", "assumed"]


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
    confidence: Confidence = "assumed"
    """measured (here, on that architecture), published (others' measurements), or assumed."""
    gemm_range: tuple[float, float] | None = None
    """(pessimistic, optimistic) `gemm` where it is assumed: estimates give a range, plan ranks
    by the pessimistic end."""
    attention_range: tuple[float, float] | None = None
    """(pessimistic, optimistic) `attention`, likewise."""
    range_source: str = ""
    # Fitted to the user's own runs (plan/calibration.py); None: the module-wide figure below.
    eager_memory: float | None = None
    """HBM fraction of eager elementwise kernels (None: EAGER_MEMORY_EFFICIENCY)."""
    intra_node: float | None = None
    """Collective bandwidth over the GPUs' links in a node (None: NVLINK_/PCIE_P2P_EFFICIENCY)."""
    inter_node: float | None = None
    """Collective bandwidth over the node's network (None: NETWORK_EFFICIENCY)."""
    overlap: float | None = None
    """Share of overlapped communication that still slows compute (None: OVERLAP_CONTENTION)."""
    fragmentation: float | None = None
    """Allocator reserve over allocated, DDP/ZeRO-1/2 (None: FRAGMENTATION['default'])."""
    fragmentation_zero3: float | None = None
    """Likewise for ZeRO-3/FSDP (None: FRAGMENTATION['zero3'])."""
    compute_scale: float = 1.0
    """Fraction of its rated compute the GPU keeps (power_capped): what scales the rates of kernels given in
    TFLOP/s rather than as fractions of this GPU's peak (attention_factors' Ampere-generation kernels, PEFT's
    fp32 adapter matmuls)."""

    @property
    def measured(self) -> bool:
        return self.confidence == "measured"

    def eager_memory_efficiency(self) -> float:
        return EAGER_MEMORY_EFFICIENCY if self.eager_memory is None else self.eager_memory

    def overlap_contention(self) -> float:
        return OVERLAP_CONTENTION if self.overlap is None else self.overlap

    def fragmentation_of(self, strategy: str) -> float:
        own = self.fragmentation_zero3 if strategy == "zero3" else self.fragmentation
        return FRAGMENTATION["zero3" if strategy == "zero3" else "default"] if own is None else own

    def bounds(self) -> tuple[ArchEfficiency, ArchEfficiency] | None:
        """These factors at the pessimistic and the optimistic end of their range (None: no range)."""
        if self.gemm_range is None and self.attention_range is None:
            return None
        g, a = self.gemm_range or (self.gemm, self.gemm), self.attention_range or (self.attention, self.attention)
        return replace(self, gemm=g[0], attention=a[0]), replace(self, gemm=g[1], attention=a[1])


def arch_efficiency(arch: str) -> ArchEfficiency:
    """The factors of a GPU architecture (`other`'s for one not listed)."""
    return ARCH.get(arch, ARCH["other"])


ARCH = {
    # H200 measured on 2026-11-29 (bench/data/gpu_ground_truth_h200_2026-11-29.json):
    # transformer-shaped bf16 GEMMs 667-795 TFLOP/s (sustained large shapes ~0.72-0.78 of 989);
    # K=768 shapes 0.82x and K=3072 0.95x of large-K ones -> K/(K+170). SDPA causal fwd+bwd:
    # hd128 290/396/487/546 TFLOP/s at s=1k/2k/4k/8k = 0.63 * s/(s+1200); hd64 0.78x of that.
    "hopper": ArchEfficiency(gemm=0.75, gemm_k0=170, attention=0.63, attention_s0=1200,
                             attention_hd64=0.78, memory=0.80,
                             source="measured on H200 (torch 2.11, CUDA 13), 2026-11-29", confidence="measured"),
    # A100: cuBLAS bf16 sustains ~270 of 312 TFLOP/s on large shapes (0.86); FlashAttention-2
    # paper (Dao 2023, Fig. 4, A100 80GB, causal fwd+bwd): ~190 TFLOP/s at hd128 for long
    # sequences, ~170 at 2k, lower for hd64.
    "ampere": ArchEfficiency(gemm=0.86, gemm_k0=128, attention=0.62, attention_s0=700,
                             attention_hd64=0.85, memory=0.80,
                             source="cuBLAS A100 GEMM reports; FlashAttention-2 paper, Fig. 4",
                             confidence="published"),
    # Blackwell: not measured here. GEMM published: torch.mm bf16 on a B200 (cuBLAS, torch 2.8 nightly
    # with CUDA 12.8; pytorch/ao PR #2427, benchmarks/float8/bench_matmul.py, 2025-06) sustains 1.51/1.41/
    # 1.45/1.42 PFLOP/s at 3072/4096/6144/8192 cubed: 0.67/0.63/0.65/0.63 of 2,250 -> 0.64 (the K ramp is
    # Hopper's, assumed: cubes do not separate K). Pessimistic: 0.68 x Hopper's, as B200 trained GPT-1.3B
    # (mixed precision) 1.55x as fast as H200 where the peaks differ 2.27x (Jarmusch & Chandrasekaran,
    # arXiv 2512.02189); optimistic: the best cube, 0.67. Attention (assumed Hopper's): FlashAttention-4 on
    # a B200 (Dao-AILab/flash-attention PR #2280, 2026-02, hd128 causal, seq 8192: forward 1418, backward
    # 1209 TFLOP/s, 1,260 fwd+bwd with backward 2.5x the forward's FLOPs) is 0.56 of 2,250, where these
    # factors give 0.63 x 8192/(8192+1200) = 0.55; pessimistic: FlashAttention-2's Ampere kernels if SDPA
    # picks them, 0.62 x 312 x 1.72 / 2250 = 0.15 (tritonbench PR #171 measured FA2 on B200 at 315-362
    # TFLOP/s forward, hd128, seq 1k-16k). Check: a GPT-1.3B (hidden 2048, 24 layers, seq 2048,
    # micro-batch 8) comes out 1.41x (pessimistic), 1.81x (point) and 1.84x (optimistic) an H200's speed
    # here; the paper's 1.55x lies inside.
    "blackwell": ArchEfficiency(gemm=0.64, gemm_k0=170, attention=0.63, attention_s0=1200,
                                attention_hd64=0.78, memory=0.80,
                                source="GEMM published (B200 torch.mm, pytorch/ao #2427); attention assumed "
                                       "equal to Hopper's (FlashAttention-4 on B200 agrees)",
                                confidence="assumed",
                                gemm_range=(0.51, 0.67), attention_range=(0.15, 0.63),
                                range_source="B200 vs H200 GPT-1.3B training, arXiv 2512.02189; B200 torch.mm "
                                             "cubes, pytorch/ao #2427; FlashAttention-2 (Ampere kernels) "
                                             "scaled by SM count x clock"),
    # Ada (L4, L40S): power-limited parts sustain a lower fraction of their tensor peak.
    # Reasoned range: datasheet peaks are at boost clock, which a 72 W (L4) or 350 W (L40S)
    # card does not hold under tensor load (pessimistic: ~30% below, 0.50); optimistic: the
    # A100's cuBLAS fraction less a margin (0.80). Attention: FlashAttention-2 runs on sm89,
    # at most the A100's 0.62, throttled likewise at the low end.
    "ada": ArchEfficiency(gemm=0.70, gemm_k0=128, attention=0.50, attention_s0=700,
                          attention_hd64=0.85, memory=0.80,
                          source="assumed (no public training measurement in our references)", confidence="assumed",
                          gemm_range=(0.50, 0.80), attention_range=(0.35, 0.60),
                          range_source="reasoned: power-capped clocks (low) to the A100's fractions (high)"),
    # V100: no FlashAttention-2 (memory-efficient attention instead), fp16 tensor cores.
    # Megatron-LM's single-V100 baseline sustains 39 TFLOP/s, 30% of peak, for a whole 1.2B
    # training step (Shoeybi et al. 2019, Sec. 5.1); that run (hidden 1536, 40 layers, seq 1024,
    # fp16, full recompute) comes out at HFU 0.26 at the pessimistic end here and 0.34 at the
    # point, so the published figure lies inside. Optimistic: GEMMs near the A100's fraction.
    "volta": ArchEfficiency(gemm=0.75, gemm_k0=128, attention=0.35, attention_s0=700,
                            attention_hd64=0.85, memory=0.80,
                            source="assumed (no public training measurement in our references)", confidence="assumed",
                            gemm_range=(0.50, 0.80), attention_range=(0.20, 0.45),
                            range_source="Megatron-LM (arXiv 1909.08053) single-V100 30% of peak (low); "
                                         "A100-like GEMM fractions (high)"),
    "other": ArchEfficiency(gemm=0.70, gemm_k0=128, attention=0.45, attention_s0=700,
                            attention_hd64=0.85, memory=0.75, source="assumed", confidence="assumed",
                            gemm_range=(0.45, 0.80), attention_range=(0.25, 0.60),
                            range_source="reasoned: no measurement of this architecture at all"),
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


def attention_factors(e: ArchEfficiency, arch: str, kernel: str, peak_tflops: float) -> tuple[float, float]:
    """(fraction of `peak_tflops`, sequence ramp s0) that causal attention with `kernel` reaches on `arch`: the
    architecture's own factors for "sdpa", an Ampere-generation kernel's A100 rate scaled by SM count x clock and
    by the compute a power cap leaves (`e.compute_scale`: the cap lowers the clock this kernel runs at too)."""
    if kernel == "sdpa" or arch not in ("ampere", *AMPERE_KERNEL_SPEEDUP):
        return e.attention, e.attention_s0
    tflops = ATTENTION_KERNELS[kernel] * A100_PEAK_TFLOPS * AMPERE_KERNEL_SPEEDUP.get(arch, 1.0) * e.compute_scale
    return tflops / peak_tflops, ARCH["ampere"].attention_s0

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

# DeepSpeed CPU-Adam (optimizer offload) is bound by its SIMD loop per core, not by host memory
# bandwidth: parameters updated per second per physical core, with the cores bound to the
# ranks (deepspeed --bind_cores_to_rank). DeepSpeed's blog "Study of ZenFlow and ZeRO offload
# performance with DeepSpeed CPU core binding" (blogs/zenflow-corebinding, 2025): Qwen2.5-1.5B
# (1.54B) on 2x A100-40GB with 2x EPYC 7742 (128 cores, AVX2), ZeRO-2 240 ms/step, ZeRO-Offload
# 1365 ms: less the PCIe copies (~0.18 s) the optimizer takes ~0.96 s = 12.5M params/s/core.
# The same rate gives the ZenFlow blog's ">4 s" CPU step for Llama-2-7B on a 4x A100 DGX and
# DeepSpeed issue #6834's ~10 s/step for Qwen-72B on 4 A100 nodes (11.4 s). AVX-512 hosts run
# faster: DeepSpeed PR #735 reports 8.2 s for 11.6B, THUDM/slime #1139 9.6 s for GLM-4.5-Air's
# 26.5B per H100 node (1.6-2.3x per core if those hosts had 48 and 112 cores): not modelled.
CPU_ADAM_PARAMS_PER_CORE_S = 12.5e6
# Host cores where the catalog has no vCPU count (--gpu without --instance): 12 vCPUs per
# GPU, the leanest 8-GPU nodes in the catalog (p4d.24xlarge, a2-highgpu-8g, ND96asr_v4: 96).
ASSUMED_HOST_VCPUS_PER_GPU = 12
# Fraction of a GPU's PCIe link that pinned host<->device copies reach.
PCIE_COPY_EFFICIENCY = 0.80
# bitsandbytes NF4 -> bf16 dequantization (QLoRA): one kernel per weight use (forward, and
# again in backward for the input gradient) that reads 4-bit codes and block constants and
# writes bf16, reaching a fraction of HBM bandwidth well below plain copies. LitGPT's resource
# tables (tutorials/resource-tables.md, 2023-10-20: A100-SXM4-40GB, bitsandbytes 0.41.1, bf16,
# Alpaca, micro-batch 1) time LoRA against bnb.nf4-dq on the same runs: +88 ms/iteration for
# Llama 2 7B (3.83 vs 2.36 min/1k), +202 ms for 13B (6.55 vs 3.19), +38 ms for StableLM-3B
# (1.87 vs 1.24): 2 dequantizations x 6.5e9, 12.7e9 and 3.2e9 weights, each moving 2.52 bytes,
# is 0.24, 0.20 and 0.28 of the A100's 1555 GB/s. Other GPUs: the same fraction of their HBM
# bandwidth (assumed).
NF4_DEQUANT_MEMORY_EFFICIENCY = 0.24

# Memory outside the tensors: allocator fragmentation (max_memory_reserved over
# max_memory_allocated, median over the H200 runs: 1.05 for DDP/single GPU, 1.19 for
# FSDP2 whose all-gather buffers live on another stream), CUDA context + cuBLAS workspace
# (0.75-0.82 GiB measured on H200 with CUDA 13), and NCCL's own buffers when ranks > 1.
FRAGMENTATION = {"default": 0.05, "zero3": 0.15}
CUDA_CONTEXT_GIB = 0.8
NCCL_BUFFERS_GIB = 0.5

# Tensor-parallel communication overlap (Megatron-Core --tp-comm-overlap with Transformer Engine's userbuffers,
# torchtitan's async TP): each all-gather / reduce-scatter of a block is split into chunks pipelined with the
# GEMM beside it, and one chunk stays exposed. Megatron-Bridge's performance guide (docs/performance-guide.mdx,
# "Tensor-parallel communication overlap"): num_split = 4 "generally provides the best performance", with one
# chunk left exposed for GEMM -> ReduceScatter. The rest runs beside the GEMMs and is charged like any other
# overlapped collective (OVERLAP_CONTENTION: the communication kernels take SMs, 16 by default). Check against
# torchtitan's same-layout pairs (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, H100, bf16): async TP
# measured 1.09x (70B, FSDP32 TP8) and 1.10x (8B, FSDP8 TP8) over plain TP; this model gives 1.08x and 1.08x.
TP_OVERLAP_EXPOSED = 0.25

# --- mixture of experts (plan/moe.py) --------------------------------------------------------
# Grouped GEMMs (one kernel over all local experts: torch._grouped_mm, Transformer Engine's
# GroupedLinear, DeepGEMM) with thousands of rows per expert run as fast as a dense GEMM of the
# same shape: DeepGEMM README (2025-02-25 table, H800, FP8), contiguous grouped 4-8 groups x
# 4096-8192 rows at 1288-1297 TFLOP/s (N 4096, K 7168) vs 1304 dense, 1093-1099 vs 1025 dense
# (N 7168, K 2048). With few rows per expert they fall: masked grouped GEMMs at 1024/512/256 rows
# per group reach 0.95/0.80/0.72 (N 4096, K 7168) and 0.84/0.84/0.74 (N 7168, K 2048) of the
# large-row figures, which rows / (rows + 100) follows (per-point fits 58..189, median 102).
# Applied to the forward and input-gradient GEMMs; the weight gradient reduces over the rows,
# where the ARCH K ramp already applies. That fit is FP8 (DeepGEMM): FP8_GROUPED_GEMM_M0.
# BF16/FP16 grouped GEMMs (torch._grouped_mm's CUTLASS kernel, what torchtitan runs) ramp slower.
# torchao PR #2490 (pytorch/ao, bench_grouped_mm.py, H100, bf16, Llama-4 17Bx16E shapes, 16 uneven
# groups over M = 8192 rows, 512 mean): 1.31 ms for K 5120 / N 8192 and 1.26 ms for K 8192 / N 5120,
# 525 and 545 TFLOP/s (the printed "pct_peak" 8.5 counts the FLOPs E times over). Against the
# hopper dense factors (0.726, 0.735 of 989 at those K) that is a ramp of 0.730 and 0.750; with
# rows / (rows + m0) the time goes as rows + m0 per group, so any split of the 8192 rows gives
# m0 = 189 and 170: 180 taken. At large rows the same kernel matches a dense GEMM: pytorch PR
# #156203, H200, 16 groups x 128000 rows, N = K = 7168, 298.7 ms = 705 TFLOP/s (0.71; dense 0.73).
GROUPED_GEMM_M0 = 180.0
FP8_GROUPED_GEMM_M0 = 100.0
# Dropless routing leaves the busiest expert-parallel rank more tokens than the mean, and that
# rank sets the pace of the experts' GEMMs and of the all-to-alls. ASSUMED 1.15 (1.1-1.2 for a
# trained router with auxiliary-loss or loss-free balancing): Wang et al. 2024 (arXiv 2408.15664)
# track per-expert max-load violation and keep it low with bias-based (DeepSeek-V3) balancing;
# a rank holds E/ep experts, which averages part of the per-expert spread away. Megatron-Core's
# MoE README warns of severe imbalance in the first 100-300 steps from scratch (not modelled).
LOAD_IMBALANCE = 1.15
# All-to-all (dispatch/combine) bandwidth as a fraction of the links. Inside a node: UCCL-EP
# README (github.com/uccl-project/uccl, ep/) on p5en, 8x H200 (NVLink 450 GB/s per direction):
# 320 GB/s dispatch and combine -> 0.70 (DeepEP on H800: 153-158 of ~160 GB/s). Across nodes,
# of each GPU's share of the node's network: UCCL-EP on p5en EFA (50 GB/s per GPU) EP16 dispatch
# 50 / combine 18 GB/s, EP24 53 / 26, EP32 54 / 43 -> 0.53, 0.70, 0.96 for a dispatch+combine
# pair; DeepEP on InfiniBand CX7 (50 GB/s per GPU) EP16-64: 43-58 GB/s. 0.75 taken.
# Those "RDMA" figures count a token's copy to its own node too (DeepEP's tests, and HybridEP's
# count_rdma_send_from_routing_map "to align with the implementation in the DeepEP, we do not set the
# local node map to zeros"). Recounted as the bytes that leave the node, HybridEP on H100 (DeepEP
# docs/README_Hybrid-EP.md: 4096 tokens x 7168, top-8 of 8 experts per rank, uniform router, torch API,
# 16 SMs, BF16 dispatch / combine) moves 35.5 / 39.4 GB/s at 32 ranks and 36.1 / 40.7 at 64 (4 and 8
# nodes; 0.71-0.81 of 50 GB/s): 0.75 stands. At 16 ranks (2 nodes) the same calls take 2.15 / 2.19 ms,
# where 0.75 gives the network 1.6 ms: there the NVLink leg binds (below).
A2A_NVLINK_EFFICIENCY = 0.70
A2A_NETWORK_EFFICIENCY = 0.75
# The NVLink leg of a hierarchical dispatch across nodes (DeepEP normal kernels, HybridEP: a token
# reaches its destination node over RDMA and is forwarded to the GPUs holding its experts by the few SMs
# the kernel is given) is slower than a one-node all-to-all over the same links: HybridEP's 16-rank H100
# figures above put 339 MB of per-GPU NVLink traffic per call (tokens x P(a GPU is hit) x 14 ranks off
# the rail) through in 2.15-2.19 ms, 154-158 GB/s of the H100's 478 -> 0.33; at 32 and 64 ranks that
# leg (373, 392 MB) fits inside the network time, as this fraction predicts.
A2A_FORWARD_NVLINK_EFFICIENCY = 0.33

# --- FP8 GEMMs (precision fp8) -----------------------------------------------------------------
# FP8 doubles the tensor cores' rate but not the per-tile costs (loads, scaling, epilogue), so its
# GEMMs reach a smaller fraction of the FP8 peak and need a longer reduction dimension K to do so.
# DeepGEMM README (2025-02-25 tables; H800 SXM5, the H100 SXM's SM90 silicon and 1979 TFLOP/s dense
# FP8 peak; NVCC 12.8): dense M=4096 GEMMs at K = 512/1536/2048/7168/7168/16384 reach 590/990/1025/
# 1058 (N 2112)/1304/1358 TFLOP/s, contiguous grouped (4-8 groups of 4096-8192 rows) 1288-1297 at
# K 7168 and 1093-1099 at K 2048. Fitted as gemm x K/(K + k0) (log error): 0.69 x K/(K + 650),
# every point within 8% but N 2112 (+19%: wave quantization, not modelled). Hopper's bf16 factors
# are 0.75 and 170: FP8 GEMMs run at 0.92 of the bf16 fraction with a 3.8x longer K ramp; other
# architectures' FP8 (Ada, Blackwell) are assumed to keep the same ratios to their own factors.
# Contrary evidence, kept out on purpose (2026-12-07): Transformer Engine's GEMM profiling (docs/examples/
# gemm_profiling, H200 NVL, 5B-model shapes, pre-quantized) times cuBLAS's tensor-wise FP8 GEMMs at 1.90x
# bf16, flat from K 4096 (fprop 1.906x) to K 15872 (wgrad 1.898x): 0.95 of the bf16 fraction with bf16's K
# ramp, where these factors give 1.74x (DeepGEMM is a block-scaled kernel). Taking TE's figures moved the
# Megatron H100 rows the right way (signed median -5.7% -> -0.6%) but every Blackwell FP8 row further into
# optimism: dense median 9.5% -> 10.8%, p90 30.8% -> 34.1% on bench/plan_accuracy_2024.py. Some other part
# of the FP8 rows is too fast by about as much, and until a GPU measurement says which, the two stay as they
# are; bench/gpu_suite.py times cuBLAS FP8 against bf16 at the presets' shapes. Rechecked on 2026-12-07, after
# the Megatron rows lost a gradient-accumulation pass Megatron does not make (Stack.wgrad_accumulates): its H100
# rows now read -4..+5% as they are, and TE's figures would make the Megatron rows lean +12% (signed median).
FP8_GEMM_SCALE = 0.69 / 0.75
FP8_GEMM_K0_SCALE = 650 / 170
# HBM bytes per element to cast a bf16 GEMM operand to FP8 under Transformer Engine's current scaling
# (the FP8 recipe of the Megatron rows on Hopper): a read for the tensor's amax, a read to scale and cast,
# and, as Hopper's FP8 GEMMs take only the TN layout, a row-wise and a transposed column-wise FP8 copy for
# the backward GEMMs: 2 + 2 + 1 + 1 (TE docs, features/low_precision_training/fp8_current_scaling:
# "quantization ... requires reading the tensor twice"; "on Ada and Hopper, the backward pass requires a
# transposed FP8 tensor"). Inputs are cast in forward, output gradients in backward; weights once per
# step (reused across micro-batches): not counted.
FP8_CAST_BYTES = 6


@dataclass(frozen=True)
class Fp8Recipe:
    """How one FP8 scaling recipe casts GEMM operands and how fast its GEMMs run, against tensor-wise scaling."""

    name: str
    cast_bytes: float
    """HBM bytes per element to cast an operand (an input forward, an output gradient backward)."""
    gemm_scale: float
    """The FP8 GEMM efficiency relative to tensor-wise scaling's (cuBLAS, one scale per tensor)."""
    source: str
    blackwell_only: bool = False
    grad_rescale_bytes: float = 0.0
    """HBM bytes per output element of each backward GEMM spent scaling it after the GEMM, in a pass of its own."""


FP8_RECIPES = {r.name: r for r in (
    Fp8Recipe("tensorwise", FP8_CAST_BYTES, 1.0,
              "current (per-tensor) scaling: amax read, scale-and-cast read, row-wise and transposed FP8 copies, "
              "2 + 2 + 1 + 1 bytes (TE fp8_current_scaling docs; torchao float8 tensorwise alike)"),
    Fp8Recipe("delayed", 4, 1.0,
              "delayed scaling: the scale comes from the amax history, so one read per quantization (TE "
              "fp8_delayed_scaling docs), 2 + 1 + 1 bytes; the GEMM is the same cuBLAS per-tensor one"),
    Fp8Recipe("blockwise", FP8_CAST_BYTES, 1.40 / 1.58,
              "1x128 / 128x128 blocks (DeepSeek-V3's): row-wise and column-wise copies each quantized from high "
              "precision, 2 + 2 + 1 + 1 bytes; on Hopper block-scaled GEMMs are software-emulated: TE's GEMM "
              "profiling (H200, 5B-model shapes, quantization included) 1.40x bf16 against current scaling's "
              "1.58x (docs/examples/gemm_profiling)"),
    Fp8Recipe("rowwise", 8, 0.95,
              "torchao row-wise scaling: casts of 5N + 3N bytes per operand (torchao testing/training/"
              "roofline_utils.py); its CUTLASS row-wise scaled GEMM reaches 90-100% of cuBLAS tensor-wise for "
              "most shapes with a tail to 50% (pytorch/pytorch#147971): 0.95 taken; its two backward GEMMs run "
              "without fast accumulation, where the row-wise kernel is so slow that torchao runs cuBLAS's "
              "tensor-wise GEMM and multiplies the bf16 output by the scales afterwards (float8_ops.py "
              "addmm_float8_unwrapped, pytorch/ao#1325): a read and a write of each output element",
              grad_rescale_bytes=4),
    Fp8Recipe("mxfp8", FP8_CAST_BYTES, 1.0,
              "MX FP8 (1x32 blocks, E8M0 scales; Blackwell only, TE mxfp8 docs): row-wise and column-wise copies "
              "each quantized from high precision, 2 + 2 + 1 + 1 bytes (the 1/32-byte scales not counted); GEMM "
              "with quantization within 2% of current scaling on B300 (TE GEMM profiling: 1.44x vs 1.41x bf16)",
              blackwell_only=True),
)}


def fp8_gemm(e: ArchEfficiency, recipe: str = "tensorwise") -> ArchEfficiency:
    """`e` with its GEMM factors as FP8 GEMMs of `recipe` reach them (FP8_GEMM_SCALE, FP8_GEMM_K0_SCALE,
    Fp8Recipe.gemm_scale)."""
    scale = FP8_GEMM_SCALE * FP8_RECIPES[recipe].gemm_scale
    return replace(e, gemm=e.gemm * scale, gemm_k0=e.gemm_k0 * FP8_GEMM_K0_SCALE,
                   gemm_range=None if e.gemm_range is None else tuple(g * scale for g in e.gemm_range))


# --- power limits (--power-limit) ------------------------------------------------------------
# A GPU held below its rated board power lowers its SM clock under tensor load; its memory clock stays
# (a 315 W cap on an RTX 3090 held the SM clock 3-11% low and never moved the memory clock:
# ashalliants/ninfer-3090 PR #72, 2 Hz nvidia-smi samples). So a cap scales what the SMs compute --
# GEMMs, attention -- and leaves HBM-bound kernels and the links alone. How much, per architecture, from
# the one public evidence that isolates it: NVIDIA's datasheet peaks of the same silicon sold at two
# board powers (dense peaks, which NVIDIA sets at the clock each part holds within its power).
#   Hopper: H100 NVL (400 W) 835 bf16 TFLOP/s against H100 SXM (700 W) 989 -> 0.844 at 0.571 of rated
#     (NVIDIA H100 datasheet; Meta's torchtitan benchmarks put their 500 W H100s "between SXM and NVL").
#   Blackwell: B100 (700 W) 1,750 against HGX B200 (1,000 W) 2,250 -> 0.778 at 0.70 of rated
#     (glennklockwood.com/garden/processors/B200; hmc-tech B100/B200 tables: tensor clock 1.44 vs
#     1.86 GHz). Check: GB200's B200 at 1,200 W, 2,500 TFLOP/s, is 1/0.90 of HGX B200's where this line,
#     run from 1,000 to 1,200 W, gives 1/0.88.
# Between a part's rated power and the lower point the scale is linear in the fraction of rated power;
# below that point, and on architectures with no such pair (Ampere: the A100 PCIe at 300 W and SXM at
# 400 W list the same peaks, which says nothing about clocks held under load), a cap is not modelled.
@dataclass(frozen=True)
class PowerPair:
    low_fraction: float  # the lower part's board power / the rated part's
    peak_ratio: float  # the lower part's dense peak / the rated part's
    source: str


POWER_PAIRS = {
    "hopper": PowerPair(400 / 700, 835 / 989, "H100 NVL (400 W) vs H100 SXM (700 W) datasheet peaks"),
    "blackwell": PowerPair(700 / 1000, 1750 / 2250, "B100 (700 W) vs HGX B200 (1,000 W) datasheet peaks"),
}


def power_scale(arch: str, limit_w: float, rated_w: float | None) -> float:
    """The fraction of its rated compute a GPU keeps at a power limit of `limit_w` (1.0 at the rated power).
    ValueError, saying what is modelled, where the limit is outside what the evidence covers."""
    pair = POWER_PAIRS.get(arch)
    if pair is None:
        raise ValueError(f"a power limit is not modelled on {arch} GPUs (no published pair of the same chip at two "
                         f"board powers); modelled on {', '.join(sorted(POWER_PAIRS))}")
    if rated_w is None:
        raise ValueError("this GPU's rated board power is not in the catalog")
    low = pair.low_fraction * rated_w
    if limit_w > rated_w or limit_w < low - 1e-9:
        raise ValueError(f"{limit_w:.10g} W is outside {low:.0f}-{rated_w:.0f} W, the range modelled for this GPU "
                         f"(its rated {rated_w:.0f} W down to {pair.low_fraction:.0%} of it: {pair.source})")
    frac = limit_w / rated_w
    return 1.0 - (1.0 - pair.peak_ratio) * (1.0 - frac) / (1.0 - pair.low_fraction)


def power_capped(e: ArchEfficiency, scale: float) -> ArchEfficiency:
    """`e` on a GPU that keeps `scale` of its rated compute: GEMM and attention factors (and their ranges)
    scaled; memory and link factors kept."""
    if scale >= 1.0:
        return e
    rng = (lambda r: None if r is None else (r[0] * scale, r[1] * scale))
    return replace(e, gemm=e.gemm * scale, attention=e.attention * scale, compute_scale=e.compute_scale * scale,
                   gemm_range=rng(e.gemm_range), attention_range=rng(e.attention_range))
