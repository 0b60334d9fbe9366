"""Runs a tiny GPT (the recipe's own shape flags: 2 layers, hidden 64) through an emitted Megatron recipe with
megatron-core 0.16.1 on CPU, one process per rank under torchrun with gloo, and the CPU patches of
tests/megatron_cpu_shim.py. Started by tests/test_recipes.py.

    torchrun --nproc-per-node=2 megatron_worker.py A.args [B.args ...]

What Megatron-LM's pretrain_gpt.py and training.py do with the flags is done here with megatron-core's own
parts: parallel_state's grids, GPTModel with the local (non-Transformer-Engine) layer spec, Float16Module for
--bf16, its DistributedDataParallel and distributed optimizer, the schedules of get_forward_backward_func and
finalize_model_grads. Without Transformer Engine: no fused kernels and no grouped GEMM (--moe-grouped-gemm is
turned off), the rest as the flags say. For each file it prints "ok FILE <loss before> <loss after>" on the last pipeline
stage of data-parallel rank 0 after 3 steps on fixed batches, and "params FILE <count> <count>" for the
parameters each rank holds (its pipeline stage, its share of the experts).
"""

import dataclasses
import sys

import torch
import torch.distributed as dist

VOCAB, STEPS = 128, 3


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def megatron_fields(text: str) -> tuple[dict, dict]:
    """(flags, TransformerConfig fields) of a megatron.args text, as Megatron-LM maps them (arguments.py:
    core_transformer_config_from_args); trainready.plan.recipes.megatron.FLAGS names each flag's field."""
    import torch

    from trainready.plan.recipes.megatron import FLAGS

    args: dict = {}
    for line in text.splitlines():
        flag, *value = line.split()
        assert flag in FLAGS, f"{flag}: not a flag this module knows (megatron.FLAGS)"
        assert flag not in args, f"{flag} given twice"
        if flag in ("--recompute-modules", "--cuda-graph-scope"):  # List fields: argparse nargs "+"
            args[flag] = value
            continue
        args[flag] = _value(value[0]) if value else True
    fields = {FLAGS[f]: v for f, v in args.items() if FLAGS[f]}
    if "add_bias_linear" in fields:  # --disable-bias-linear sets the field to False
        fields["add_bias_linear"] = False
    if "--num-virtual-stages-per-pipeline-rank" in args:  # validate_args sets the field from it
        fields["virtual_pipeline_model_parallel_size"] = args["--num-virtual-stages-per-pipeline-rank"]
    if "--num-experts" in args:  # arguments.py: --num-experts is TransformerConfig.num_moe_experts
        fields["num_moe_experts"] = args["--num-experts"]
    if "--moe-layer-freq" in args:  # arguments.py moe_freq_type: a Python list expression
        fields["moe_layer_freq"] = eval(args["--moe-layer-freq"], {"__builtins__": {}})  # noqa: S307
    dtype = torch.bfloat16 if args.get("--bf16") else torch.float16 if args.get("--fp16") else torch.float32
    fields["params_dtype"] = fields["pipeline_dtype"] = dtype  # as Megatron-LM derives them from --bf16/--fp16
    return args, fields


def run(path: str) -> None:
    """One recipe's args file: its model, grids, optimizer and 3 steps; "params NAME ..." and "ok NAME ..." lines."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    args, fields = megatron_fields(open(path).read())
    if args.get("--swiglu"):  # pretrain_gpt.py's model builder: gated SiLU
        fields.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu, bias_activation_fusion=False)
    # no Transformer Engine or CUDA kernels on CPU: megatron-core's own switches for its unfused paths
    fields.update(moe_grouped_gemm=False, use_cpu_initialization=True, masked_softmax_fusion=False,
                  bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
                  persist_layer_norm=False)
    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    if fields.get("cuda_graph_impl", "none") != "none":  # Megatron-Core's own checks see the graphs asked for; CPU
        TransformerConfig(**{k: v for k, v in fields.items() if k in known})  # has no graphs to capture: run without
        fields.update(cuda_graph_impl="none", cuda_graph_scope=[])
    config = TransformerConfig(**{k: v for k, v in fields.items() if k in known})
    ps.initialize_model_parallel(tensor_model_parallel_size=config.tensor_model_parallel_size,
                                 pipeline_model_parallel_size=config.pipeline_model_parallel_size,
                                 expert_model_parallel_size=config.expert_model_parallel_size,
                                 expert_tensor_parallel_size=config.expert_tensor_parallel_size)
    torch.manual_seed(1234)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    seq, micro = args["--seq-length"], args["--micro-batch-size"]
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False,
                                    normalization=args.get("--normalization"))
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB,
                     max_sequence_length=args["--max-position-embeddings"], pre_process=first, post_process=last,
                     share_embeddings_and_output_weights=not args.get("--untie-embeddings-and-output-weights"),
                     position_embedding_type=args["--position-embedding-type"],
                     rotary_base=args.get("--rotary-base", 10000))
    if config.num_moe_experts:  # the routed experts are split: this rank holds num_experts / ep of them
        moe = next(m for m in model.modules() if type(m).__name__ == "MoELayer")
        assert len(moe.local_expert_indices) == config.num_moe_experts // config.expert_model_parallel_size
    held = [None] * dist.get_world_size()  # the parameters each rank holds, printed once by rank 0
    dist.all_gather_object(held, sum(p.numel() for p in model.parameters()))
    if dist.get_rank() == 0:
        sys.stdout.write(f"params {path} {' '.join(map(str, held))}\n")  # one write: the ranks share this pipe
        sys.stdout.flush()
    if config.bf16:
        model = Float16Module(config, model)  # as Megatron-LM's get_model does for --bf16
    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce="--overlap-grad-reduce" in args,
                                        overlap_param_gather="--overlap-param-gather" in args,
                                        use_distributed_optimizer="--use-distributed-optimizer" in args)
    model = DistributedDataParallel(config, ddp, model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=3e-3, bf16=config.bf16, clip_grad=1.0,
                                                 use_distributed_optimizer=ddp.use_distributed_optimizer), [model])
    config.no_sync_func, config.finalize_model_grads_func = model.no_sync, finalize_model_grads  # as training.py
    dp = ps.get_data_parallel_world_size()
    micro_batches = args["--global-batch-size"] // (micro * dp)
    g = torch.Generator().manual_seed(7 + ps.get_data_parallel_rank())
    batches = [torch.randint(0, VOCAB, (micro, seq + 1), generator=g) for _ in range(micro_batches)]

    def forward_step(data, model):
        b = next(data)
        out = model(b[:, :-1].contiguous(), torch.arange(seq).expand(micro, seq), None, labels=b[:, 1:].contiguous())
        return out, lambda o: (o.float().mean(), {"loss": o.float().mean().detach().clone()})  # the schedule
        # divides the returned loss in place: the reported one is a copy

    losses = []
    for _ in range(STEPS):
        model.zero_grad_buffer()
        opt.zero_grad()
        out = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
                                          num_microbatches=micro_batches, seq_length=seq, micro_batch_size=micro,
                                          forward_only=False)
        ok, _, _ = opt.step()
        assert ok
        if last:
            loss = torch.stack([x["loss"] for x in out]).mean()
            dist.all_reduce(loss, group=ps.get_data_parallel_group())
            losses.append(loss.item() / dp)
    if last and ps.get_data_parallel_rank() == 0:
        sys.stdout.write(f"ok {path} {losses[0]:.4f} {losses[-1]:.4f}\n")
        sys.stdout.flush()
    ps.destroy_model_parallel()
    dist.barrier()


def main() -> None:
    """Each args file given, one after the other in one process group (megatron-core and torch import once)."""
    import megatron_cpu_shim

    megatron_cpu_shim.install()
    dist.init_process_group("gloo")
    for path in sys.argv[1:]:
        run(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
