"""Test plumbing: megatron-core 0.16.1 on a CPU-only torch, for tests/megatron_worker.py. Megatron-core
is CUDA-only code; these patches let its real model, schedules, dispatchers and distributed optimizer run
on gloo processes. Each, and why (file:line in megatron-core 0.16.1):
1. DeviceToCPU (a TorchFunctionMode): allocations with device="cuda" (schedules.py:596/983/2138,
   transformer/utils.py:35) or .cuda() / .to("cuda") go to the CPU.
2. torch.cuda.current_device() -> cpu: DDP's buffers (param_and_grad_buffer.py:783-806), p2p
   (p2p_communication.py:190-321) and _AllToAll.backward (mappings.py:439, where the mode of 1 is off).
3. CUDA streams and events are no-ops (DDP's overlap stream, the alltoall dispatcher's device-to-host
   stream and event, token_dispatcher.py:445/871-899): every CPU op is synchronous.
4. The CUDA RNG calls use a CPU generator state, so model_parallel_cuda_manual_seed and the tracker's
   fork() run (tensor_parallel/random.py:55); the recipes set dropout 0.
5. Tensor.type() answers "torch.cuda.<X>Tensor": the optimizers accept only those (distrib_optimizer.py:361,
   optimizer.py:671).
6. moe_utils.te_general_gemm = None: a megatron-core 0.16.1 bug without Transformer Engine, not a CPU one
   (the name is bound only when TE imports, moe_utils.py:22-39, but the router reads it, moe_utils.py:1192).
7. maybe_move_tensor_to_cpu converts CUDA tensors only (moe_utils.py:1093); the alltoall split sizes are
   given the numpy form the GPU path gives them, as all_to_all_single takes no tensor split sizes.
8. The local spec's torch norm refuses sequence parallelism (transformer/torch_norm.py:32) only because it does
   not mark its weights: with --sequence-parallel the norm is built as torch's and its parameters marked
   sequence_parallel, as Transformer Engine's and the fused norms mark theirs (fusions/fused_layer_norm.py), so
   finalize_model_grads all-reduces their gradients over the TP ranks.
"""

import contextlib

import torch
from torch.overrides import TorchFunctionMode


def _cpu(d):
    if d is None:
        return d
    if isinstance(d, int):
        return torch.device("cpu")
    if isinstance(d, str) and d.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(d, torch.device) and d.type == "cuda":
        return torch.device("cpu")
    return d


class DeviceToCPU(TorchFunctionMode):
    """Patches 1 and 5."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        name = getattr(func, "__name__", "")
        if name == "cuda":  # Tensor.cuda()
            return args[0]
        if name == "type" and len(args) == 1 and not kwargs:  # 5
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if name == "to" and args:
            args = (args[0],) + tuple(_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args[1:])
        return func(*args, **kwargs)


class _Stream:
    def __init__(self, *a, **k):
        pass

    def wait_stream(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def record_event(self, *a, **k):
        return _Event()  # alltoall dispatcher: d2h_event.synchronize()


class _Event:
    def __init__(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def wait(self, *a, **k):
        pass

    def record(self, *a, **k):
        pass

    def query(self):
        return True


def install() -> None:
    """Patches 1-8, once, before megatron-core builds anything (the mode of 1 stays on in this thread)."""
    import megatron.core.transformer.moe.moe_utils as mu
    import megatron.core.transformer.moe.token_dispatcher as td
    import megatron.core.transformer.torch_norm as tn

    DeviceToCPU().__enter__()  # 1
    torch.cuda.current_device = lambda: torch.device("cpu")  # 2
    torch.cuda.is_available = lambda: False
    torch.cuda.synchronize = lambda *a, **k: None  # 3
    torch.cuda.Event, torch.cuda.Stream = _Event, _Stream
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.default_stream = torch.cuda.current_stream = lambda *a, **k: _Stream()
    state = {"s": torch.get_rng_state()}  # 4
    torch.cuda.get_rng_state = torch.cuda.random.get_rng_state = lambda *a, **k: state["s"].clone()
    torch.cuda.set_rng_state = torch.cuda.random.set_rng_state = lambda s, *a, **k: state.update(s=s.clone())
    torch._C._cuda_setRNGState = lambda s: state.update(s=s.clone())
    torch.cuda.manual_seed = lambda seed: state.update(s=torch.Generator().manual_seed(seed).get_state())
    if not hasattr(mu, "te_general_gemm"):  # 6
        mu.te_general_gemm = None
    original = mu.maybe_move_tensor_to_cpu

    def move(tensor, as_numpy=False, record_stream=False):  # 7
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    mu.maybe_move_tensor_to_cpu = td.maybe_move_tensor_to_cpu = move
    wrapped_new = tn.WrappedTorchNorm.__new__

    def norm(cls, config, hidden_size, eps=1e-5, **kwargs):  # 8
        if not config.sequence_parallel:
            return wrapped_new(cls, config, hidden_size, eps, **kwargs)
        module = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}[config.normalization](
            hidden_size, eps=eps)
        for p in module.parameters():
            p.sequence_parallel = True
        return module

    tn.WrappedTorchNorm.__new__ = norm
