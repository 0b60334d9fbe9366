"""Runs a tiny model (2 blocks, hidden 64, random init) through an emitted recipe on CPU, one
process per rank under torchrun with gloo. Started by tests/test_recipes.py.

    torchrun --nproc-per-node=2 recipe_worker.py titan torchtitan.args
    torchrun --nproc-per-node=2 recipe_worker.py titan-moe torchtitan.args  (torchtitan's Qwen3 MoE, its EP)
    torchrun --nproc-per-node=2 recipe_worker.py deepspeed ds_config.json SEQ_LEN
    torchrun --nproc-per-node=2 recipe_worker.py deepspeed-hf ds_config.json SEQ_LEN  (a Hugging Face Llama)
    torchrun --nproc-per-node=2 recipe_worker.py rows rows.json  (several of the above in one process group)

It prints "ok <loss before> <loss after>" on rank 0 after training on one fixed batch.
"""


import json
import os
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, FFN, LAYERS = 128, 64, 4, 128, 2
STEPS = 3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.wqkv, self.wo = nn.Linear(DIM, 3 * DIM, bias=False), nn.Linear(DIM, DIM, bias=False)
        self.w1, self.w3 = nn.Linear(DIM, FFN, bias=False), nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).view(b, s, 3, HEADS, DIM // HEADS).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, DIM))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm, self.output = nn.RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for block in self.layers.values():
            x = block(x)
        return self.output(self.norm(x)).float()


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    logits = getattr(logits, "logits", logits)  # a Hugging Face model returns an output object
    return F.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))


def titan_config(args: list[str]):
    """The recipe's overrides parsed by torchtitan's own parser (tyro with torchtitan's registry)
    into torchtitan's config dataclasses: the sections of Trainer.Config the recipe sets."""
    import tyro
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.config.manager import ConfigManager, custom_registry
    from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC

    @dataclass(kw_only=True)
    class Job:  # Trainer.Config's fields of these names and types (torchtitan/trainer.py)
        training: TrainingConfig = field(default_factory=TrainingConfig)
        parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
        checkpoint: CheckpointManager.Config = field(default_factory=CheckpointManager.Config)
        compile: CompileConfig = field(default_factory=CompileConfig)  # its __post_init__ checks async TP's needs
        activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)

    ConfigManager()  # registers torchtitan's tyro rules on custom_registry
    return tyro.cli(Job, args=args, default=Job(), registry=custom_registry)


def titan_on_cpu() -> None:
    """torchtitan falls back to "cuda" when no accelerator is found (tools/utils.py device_type), and its
    parallel_dims copies that name at import to build its meshes on: "cpu", before anything imports it."""
    import torchtitan.tools.utils as tu

    tu.device_type = "cpu"


def run_titan(path: str) -> tuple[float, float]:
    """FSDP2 as torchtitan applies it (models/llama3/parallelize.py): the AC policy on every
    block, fully_shard per block and on the whole model with its MixedPrecisionPolicy."""
    titan_on_cpu()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.distributed.parallel_dims import ParallelDims

    cfg = titan_config(open(path).read().split())
    p, t = cfg.parallelism, cfg.training
    world = dist.get_world_size()
    ParallelDims.from_config(p, world)  # torchtitan's own check of the degrees against the world size
    assert p.tensor_parallel_degree == p.pipeline_parallel_degree == 1, "the CPU run covers data parallelism"
    mesh = init_device_mesh("cpu", (p.data_parallel_replicate_degree, p.data_parallel_shard_degree),
                            mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(0)
    model = Tiny()
    if cfg.activation_checkpoint is not None:
        cfg.activation_checkpoint.build().apply(model)
    mp = MixedPrecisionPolicy(param_dtype=TORCH_DTYPE_MAP[t.mixed_precision_param],
                              reduce_dtype=TORCH_DTYPE_MAP[t.mixed_precision_reduce])
    kw = dict(mesh=mesh, mp_policy=mp, **({"offload_policy": CPUOffloadPolicy()} if t.enable_cpu_offload else {}))
    for block in model.layers.values():
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    dp = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
    accum = t.global_batch_size // (t.local_batch_size * dp)
    assert accum * t.local_batch_size * dp == t.global_batch_size
    return train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), t.local_batch_size, accum, t.seq_len)


def import_titan_moe() -> None:
    """Imports torchtitan's MoE modules on a machine without triton. models/common/token_dispatcher.py imports
    distributed/minimal_async_ep, whose kernels.py runs `import triton` and defines its async-EP kernels at
    import time (@triton.jit decorators, tl.* annotations); the standard all-to-all dispatcher never launches
    them. A stub whose jit hands the function back and whose attributes are an inert placeholder stands in
    for triton while minimal_async_ep (api.py, kernels.py) alone imports, its other imports loaded first, and
    leaves sys.modules after, so torch's own triton probes (inductor) never see it. With triton installed
    nothing is stubbed."""
    import importlib.util
    import types

    if importlib.util.find_spec("triton") is None:
        import torch.distributed._symmetric_memory  # noqa: F401  api.py's other imports, loaded without the stub
        import torchtitan.distributed  # noqa: F401
        import torchtitan.tools.logging  # noqa: F401

        class Placeholder:  # tl.constexpr, tl.pointer_type(tl.int64), tl.bfloat16, ...: stored, never run
            def __getattr__(self, name):
                return self

            def __call__(self, *args, **kwargs):
                return self

        def module_attr(name):
            if name.startswith("__"):  # __file__, __path__, ...: absent, as inspect and importlib expect
                raise AttributeError(name)
            return Placeholder()

        def jit(fn=None, **kwargs):  # both @triton.jit and @triton.jit(do_not_specialize=[...])
            return fn if fn is not None else (lambda f: f)

        triton, language = types.ModuleType("triton"), types.ModuleType("triton.language")
        triton.jit, triton.language = jit, language
        triton.__getattr__ = language.__getattr__ = module_attr
        sys.modules.update({"triton": triton, "triton.language": language})
        try:
            import torchtitan.distributed.minimal_async_ep  # noqa: F401
        finally:
            del sys.modules["triton"], sys.modules["triton.language"]
    import torchtitan.models.qwen3  # noqa: F401  (token_dispatcher now finds minimal_async_ep imported)


def tiny_qwen3_moe(seq_len: int):
    """torchtitan's Qwen3Model, its tiny MoE shape after models/qwen3/config_registry.py (qwen3_moe_debug):
    every block MoE with 4 routed experts of FFN 128, top-2, RoPE theta 1e6, no q/k norm."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import (
        make_gqa_config,
        make_moe_config,
        make_routed_experts_config,
        make_router_config,
    )
    from torchtitan.models.qwen3 import _EMBEDDING_INIT, _LINEAR_INIT, _moe_experts_init, _qwen3_norm, _residual_output_init
    from torchtitan.models.qwen3.model import Qwen3Model, Qwen3TransformerBlock

    experts, head_dim = 4, DIM // HEADS
    block = Qwen3TransformerBlock.Config(
        attention_norm=_qwen3_norm(DIM), ffn_norm=_qwen3_norm(DIM),
        attention=make_gqa_config(
            dim=DIM, n_heads=HEADS, n_kv_heads=HEADS, head_dim=head_dim, fuse_qkv=True, qk_norm=None,
            wqkv_param_init=_LINEAR_INIT, wo_param_init=_residual_output_init(LAYERS),
            # causal SDPA, not Qwen3's flex attention, which has no backward on CPU
            inner_attention=ScaledDotProductAttention.Config(),
            rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=seq_len, theta=1e6)),
        moe=make_moe_config(
            num_experts=experts,
            router=make_router_config(dim=DIM, num_experts=experts, gate_param_init=_LINEAR_INIT, top_k=2,
                                      score_func="softmax", route_norm=True),
            routed_experts=make_routed_experts_config(
                dim=DIM, hidden_dim=FFN, num_experts=experts, top_k=2, param_init=_moe_experts_init(LAYERS),
                comm_backend="standard")))  # the all-to-all dispatcher (gloo carries it)
    return Qwen3Model.Config(
        vocab_size=VOCAB, dim=DIM, norm=_qwen3_norm(DIM), layers=[block] * LAYERS,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_LINEAR_INIT))


def run_titan_moe(path: str) -> tuple[float, float, float]:
    """torchtitan's own Qwen3 MoE model through its own parallelize_qwen3 (expert parallelism, then FSDP2 on
    the dp and efsdp meshes of its ParallelDims), with the recipe's parallelism / training / compile / AC
    sections; the routed experts must come out split over the "ep" mesh. Also returns the parameter elements the
    fullest rank holds."""
    import functools

    titan_on_cpu()
    import_titan_moe()
    import torchtitan.distributed.fsdp as tfsdp
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models.qwen3.parallelize import parallelize_qwen3
    from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config

    # --training.enable_cpu_offload: torchtitan's CPUOffloadPolicy() pins memory, which needs an accelerator
    tfsdp.CPUOffloadPolicy = functools.partial(tfsdp.CPUOffloadPolicy, pin_memory=False)
    cfg = titan_config(open(path).read().split())
    p, t = cfg.parallelism, cfg.training
    dims = ParallelDims.from_config(p, dist.get_world_size())
    dims.build_mesh()
    set_spmd_backend(p.spmd_backend)  # as Trainer.__init__
    model_config = tiny_qwen3_moe(t.seq_len)
    # the part of Qwen3Model.Config.update_from_config this needs: the sharding plan model.parallelize applies
    # (the whole call imports torchtitan.trainer, hence datasets)
    set_qwen3_sharding_config(model_config, enable_sp=p.enable_sequence_parallel,
                              enable_ep=p.expert_parallel_degree > 1)
    torch.manual_seed(0)
    model = model_config.build()
    with torch.no_grad():
        model.init_weights()  # torchtitan's init (each module's param_init), as Trainer.__init__
    model = parallelize_qwen3(model, parallel_dims=dims, training=t, parallelism=p, compile_config=cfg.compile,
                              ac_config=cfg.activation_checkpoint, dump_folder=".")
    for m in model.modules():
        if isinstance(m, FSDPModule):
            # torchtitan sets gradient divide factor 1, so FSDP2 reduces with PREMUL_SUM, which gloo lacks;
            # a plain SUM is the same arithmetic
            m.set_force_sum_reduction_for_comms(True)
    w1 = model.layers["0"].moe.routed_experts.inner_experts.w1_EFD  # (experts, FFN, DIM)
    names = w1.device_mesh.mesh_dim_names if isinstance(w1, DTensor) else ()
    # expert parallelism really split the routed experts: dim 0 sharded over the "ep" mesh dim of its degree
    assert dims.ep == 1 or ("ep" in names and w1.placements[names.index("ep")].is_shard(0)
                            and w1.device_mesh.size(names.index("ep")) == dims.ep), (names, w1.placements)
    dp = dims.dp_replicate * dims.dp_shard  # the batch degree (Trainer.__init__'s "batch" mesh)
    accum = t.global_batch_size // (t.local_batch_size * dp)
    assert accum * t.local_batch_size * dp == t.global_batch_size
    held = [None] * dist.get_world_size()  # parameter elements each rank holds: its FSDP shards, its experts
    dist.all_gather_object(held, sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters()))
    first, last = train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), t.local_batch_size, accum, t.seq_len)
    return first, last, float(max(held))


def deepspeed_config(path: str) -> dict:
    """The recipe's JSON; its "auto" values filled as the Hugging Face Trainer fills them from the command's
    TrainingArguments flags (sys.argv[4:]; --use_cpu since these processes have no GPU for --bf16)."""
    cfg = json.load(open(path))
    if "auto" not in json.dumps(cfg):
        return cfg
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        [*sys.argv[4:], "--use_cpu", "--output_dir", "trainer-output"])
    hf = HfTrainerDeepSpeedConfig(cfg)
    hf.trainer_config_process(args)
    cfg = hf.config
    if os.environ.get("RECIPE_TORCH_ADAM") and "optimizer" in cfg:
        # test plumbing: torch's AdamW on the offloaded fp32 states in place of DeepSpeed's CPU-Adam, whose JIT C++
        # build takes about 50 s; DeepSpeed's own switch (engine.get_optimizer_configuration), the offload kept
        cfg["optimizer"]["params"]["torch_adam"] = True
    return cfg


QLORA_BASE = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                  bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)


def hf_model():
    """A tiny Hugging Face Llama (what AutoTP knows how to split), or a tiny Mixtral with RECIPE_MOE=1 (AutoEP);
    wrapped in PEFT LoRA of rank RECIPE_LORA_RANK when set, as the recipe's note says; with RECIPE_QLORA=1 the
    base is saved and loaded again 4-bit through bitsandbytes with the note's BitsAndBytesConfig (QLORA_BASE)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    shape = dict(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
                 num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=64)
    if os.environ.get("RECIPE_MOE"):
        model = MixtralForCausalLM(MixtralConfig(**shape, num_local_experts=4, num_experts_per_tok=2))
    else:
        model = LlamaForCausalLM(LlamaConfig(**shape))
    if os.environ.get("RECIPE_QLORA"):
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        base = "base"  # random weights (the same seed on every rank), written here: nothing is downloaded
        if dist.get_rank() == 0:  # transformers writes config.json from the main process only
            model.save_pretrained(base)
        dist.barrier()
        model = AutoModelForCausalLM.from_pretrained(base, quantization_config=BitsAndBytesConfig(**QLORA_BASE),
                                                     dtype=torch.bfloat16, device_map="cpu")
    if os.environ.get("RECIPE_LORA_RANK"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=int(os.environ["RECIPE_LORA_RANK"]), target_modules="all-linear"))
    return model


def hf_llama_engine(path: str):
    """(engine, optimizer, config) of hf_model() handed with the JSON to deepspeed.initialize, as an HF script
    does."""
    import deepspeed
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False  # as run_deepspeed
    cfg = deepspeed_config(path)
    model = hf_model()
    trainable = [p for p in model.parameters() if p.requires_grad]
    # with an "optimizer" block (offload rows) DeepSpeed builds the optimizer and the Trainer passes none
    client = None if "optimizer" in cfg else torch.optim.AdamW(trainable, lr=1e-2)
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, optimizer=client, config=cfg)
    return engine, opt, cfg


def run_deepspeed_hf(path: str) -> tuple[float, float]:
    """The JSON with a Hugging Face Llama; the ranks of a TP group read the same batch."""
    engine, opt, cfg = hf_llama_engine(path)
    tp = cfg.get("tensor_parallel", {}).get("autotp_size", 1)
    return train(engine, opt, cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"],
                 int(sys.argv[3]), engine=engine, data_rank=dist.get_rank() // tp)


def saved_in_layers(path: str) -> tuple[float, float]:
    """Bytes autograd saves inside the decoder layers of the Hugging Face Llama for one micro-batch, on this rank,
    under the JSON's AutoTP degree (or none): (bytes, 0)."""
    engine, _, cfg = hf_llama_engine(path)
    inside, storages = [False], {}
    weights = {p.untyped_storage().data_ptr() for p in engine.module.parameters()}  # parameters are not activations

    def pack(t):
        if inside[0] and t.numel() and t.untyped_storage().data_ptr() not in weights:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    for layer in engine.module.model.layers:
        layer.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
        layer.register_forward_hook(lambda *a: inside.__setitem__(0, False))
    tokens = torch.randint(0, VOCAB, (cfg["train_micro_batch_size_per_gpu"], int(sys.argv[3])),
                           generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        engine(tokens)
    return float(sum(storages.values())), 0.0


def train(model, opt, micro: int, accum: int, seq: int, engine=None, data_rank: int | None = None) -> tuple[float, float]:
    """STEPS optimizer steps of `accum` micro-batches on one fixed batch; with a DeepSpeed engine,
    its backward and step every micro-batch (it scales the loss and steps at the boundary)."""
    g = torch.Generator().manual_seed(1 + (dist.get_rank() if data_rank is None else data_rank))
    batch = torch.randint(0, VOCAB, (accum, micro, seq + 1), generator=g)
    losses = []
    for _ in range(STEPS):
        total = 0.0
        for i in range(accum):
            loss = loss_of(model, batch[i])
            if engine is not None:
                engine.backward(loss)
                engine.step()
            else:
                (loss / accum).backward()
            total += loss.item() / accum
        if engine is None:
            opt.step()
            opt.zero_grad()
        losses.append(total)
    return losses[0], losses[-1]


def run_deepspeed(path: str) -> tuple[float, float]:
    import deepspeed
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    # test plumbing: skip the JIT build of DeepSpeed's shared-memory allreduce (a C++ compile of
    # about 100 s); gloo carries the collectives instead
    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    cfg = deepspeed_config(path)
    torch.manual_seed(0)
    model = Tiny()
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                             config=cfg)
    assert engine.zero_optimization_stage() == cfg["zero_optimization"]["stage"]
    return train(engine, opt, cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"],
                 int(sys.argv[3]), engine=engine)


def run_rows(manifest: str) -> None:
    """Every row of the manifest (a JSON list of name, kind, config, seq, flags, env and, for a row that must not
    start, expect) through the function of its kind, one after the other in this process group: torch, DeepSpeed,
    transformers and torchtitan import once (about 6 s of each 2-process run). Rank 0 prints "ok NAME <values>" per
    row. A rank whose row raises prints "fail NAME rank R: <error>" and exits at once (os._exit), so torchrun stops
    the group: the other rank may be waiting in that row's collective. A row with `expect` must raise an error
    holding that text on every rank: each prints "refused NAME rank R: <error>" and exits 0, so it comes last."""
    import gc

    rows = json.load(open(manifest))
    assert all("expect" not in row for row in rows[:-1]), "a row that must fail ends the run: put it last"
    for row in rows:
        for key in [k for k in os.environ if k.startswith("RECIPE_")]:
            del os.environ[key]
        os.environ.update(row["env"])
        sys.argv[3:] = [str(row["seq"]), *row["flags"]]  # where deepspeed_config and run_deepspeed_hf read them
        try:
            values = {"deepspeed-hf": run_deepspeed_hf, "saved-in-layers": saved_in_layers, "titan": run_titan,
                      "titan-moe": run_titan_moe, "deepspeed": run_deepspeed}[row["kind"]](row["config"])
        except Exception as exc:  # reported by name and rank; the test fails on it
            error = f"{type(exc).__name__}: {exc}".replace("\n", " ")
            refused = row.get("expect") is not None and row["expect"] in error
            sys.stdout.write(f"{'refused' if refused else 'fail'} {row['name']} rank {dist.get_rank()}: {error}\n")
            sys.stdout.flush()
            os._exit(0 if refused else 1)
        if dist.get_rank() == 0:
            sys.stdout.write(f"ok {row['name']} " + " ".join(f"{v:.4f}" for v in values) + "\n")
            sys.stdout.flush()
        gc.collect()
        dist.barrier()
    dist.destroy_process_group()
    sys.exit(0)


def main() -> None:
    kind, path = sys.argv[1], sys.argv[2]
    if kind in ("titan", "titan-moe", "rows"):
        from datetime import timedelta

        dist.init_process_group("gloo", timeout=timedelta(seconds=180))  # a stuck collective fails, not hangs 30 min
    if kind == "rows":
        run_rows(path)
    first, last = {"titan": run_titan, "titan-moe": run_titan_moe, "deepspeed": run_deepspeed,
                   "deepspeed-hf": run_deepspeed_hf, "saved-in-layers": saved_in_layers}[kind](path)
    if int(os.environ["RANK"]) == 0:
        print(f"ok {first:.4f} {last:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
