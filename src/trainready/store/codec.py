"""Split a state tree into tensors (for DCP) and a JSON skeleton (for everything else).

Nothing non-tensor is ever pickled: the skeleton is JSON with a few tags for what JSON lacks
(tuples, non-string keys, bytes, small inline tensors for per-rank state). Loading it cannot
run code. Tensor leaves become `{"__tensor__": KEY}` references into the flat DCP dict.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import torch

from .errors import BadStateError

_TAGS = ("__tensor__", "__tuple__", "__dict__", "__bytes__", "__inline_tensor__", "__float__")
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool)}


def _encode_float(value: float) -> Any:
    return value if math.isfinite(value) else {"__float__": repr(value)}


def split(tree: Any, prefix: str, tensors: dict[str, torch.Tensor], *, inline: bool = False) -> Any:
    """JSON skeleton of `tree`; tensor leaves go into `tensors` under `prefix`-based keys
    (or inline as base64 when `inline`, for small per-rank state such as RNG)."""
    if isinstance(tree, torch.Tensor):
        if inline:
            cpu = tree.detach().cpu().contiguous()
            return {"__inline_tensor__": {"dtype": str(cpu.dtype).removeprefix("torch."), "shape": list(cpu.shape),
                                          "data": base64.b64encode(_raw_bytes(cpu)).decode()}}
        tensors[prefix] = tree
        return {"__tensor__": prefix}
    if isinstance(tree, dict):
        if all(isinstance(k, str) for k in tree) and not any(k in _TAGS for k in tree):
            return {k: split(v, f"{prefix}/{k}", tensors, inline=inline) for k, v in tree.items()}
        items = []
        for k, v in tree.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise BadStateError(f"state key {k!r} at '{prefix}' is a {type(k).__name__}; keys must be str/int/float/bool")
            items.append([k, split(v, f"{prefix}/{k}", tensors, inline=inline)])
        return {"__dict__": items}
    if isinstance(tree, (list, tuple)):
        body = [split(v, f"{prefix}/{i}", tensors, inline=inline) for i, v in enumerate(tree)]
        return {"__tuple__": body} if isinstance(tree, tuple) else body
    if isinstance(tree, bool) or tree is None or isinstance(tree, (int, str)):
        return tree
    if isinstance(tree, float):
        return _encode_float(tree)
    if isinstance(tree, bytes):
        return {"__bytes__": base64.b64encode(tree).decode()}
    if type(tree).__module__ == "numpy":
        return split(tree.tolist(), prefix, tensors, inline=inline)
    raise BadStateError(
        f"state value at '{prefix}' is a {type(tree).__module__}.{type(tree).__name__}; checkpoints hold tensors and "
        "JSON values (dict, list, tuple, str, int, float, bool, None, bytes) so that loading never unpickles code. "
        "Convert it in state_dict()/load_state_dict().")


def join(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of `split`: rebuild the tree, taking tensor leaves from `tensors`."""
    if isinstance(skeleton, list):
        return [join(v, tensors) for v in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    if len(skeleton) == 1:
        (tag, body), = skeleton.items()
        if tag == "__tensor__":
            return tensors[body]
        if tag == "__tuple__":
            return tuple(join(v, tensors) for v in body)
        if tag == "__dict__":
            return {k: join(v, tensors) for k, v in body}
        if tag == "__bytes__":
            return base64.b64decode(body)
        if tag == "__float__":
            return float(body)
        if tag == "__inline_tensor__":
            return _inline_tensor(body)
    return {k: join(v, tensors) for k, v in skeleton.items()}


def tensor_refs(skeleton: Any) -> list[str]:
    """Every DCP key the skeleton refers to."""
    if isinstance(skeleton, list):
        return [key for v in skeleton for key in tensor_refs(v)]
    if not isinstance(skeleton, dict):
        return []
    if len(skeleton) == 1 and "__tensor__" in skeleton:
        return [skeleton["__tensor__"]]
    if len(skeleton) == 1 and "__dict__" in skeleton:
        return [key for _, v in skeleton["__dict__"] for key in tensor_refs(v)]
    return [key for v in skeleton.values() for key in tensor_refs(v)]


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    # Small per-rank tensors only (RNG states, a few KiB): no numpy needed.
    return bytes(tensor.reshape(-1).view(torch.uint8).tolist()) if tensor.numel() else b""


def _inline_tensor(body: dict[str, Any]) -> torch.Tensor:
    dtype = _DTYPES.get(body["dtype"])
    if dtype is None:
        raise ValueError(f"inline tensor dtype {body['dtype']!r} is not supported")
    raw = bytearray(base64.b64decode(body["data"]))
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(body["shape"]).clone()
