"""A small GPT trained with the trainready session API: DDP over gloo (CPU) or NCCL (GPU).

    python examples/tiny_gpt.py --steps 40                       # one process
    trainready run --nproc-per-node 2 -- python examples/tiny_gpt.py --steps 40

    # streamed from packed shards (local or s3://) instead of the in-memory corpus:
    python examples/tiny_gpt.py --write-corpus /tmp/corpus
    trainready data pack /tmp/corpus --format tokens --out s3://bucket/tiny --shard-size 1MiB
    trainready run --nproc-per-node 2 -- python examples/tiny_gpt.py --data s3://bucket/tiny

Seeded and resumable: the data position, RNG states, model, optimizer and LR schedule are in
the checkpoint, so a run killed at any moment and started again with the same command ends
with the same per-step losses and the same `final_state_sha256=` (rank 0's last stdout line)
as a run never interrupted. The corpus is generated (a seeded word-level Markov chain), so
nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import trainready
from trainready.plan.model_spec import ModelSpec
from trainready.store import Position, training_state

VOCAB = 256  # bytes


def make_corpus(n_bytes: int = 400_000, seed: int = 1234) -> torch.Tensor:
    """Made-up words strung together by a seeded Markov chain: structure a model can learn."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    words = ["".join(rng.choice(letters[: rng.randint(6, 26)]) for _ in range(rng.randint(2, 8))) for _ in range(300)]
    follow = {w: rng.sample(words, 6) for w in words}
    out, word = [], rng.choice(words)
    size = 0
    while size < n_bytes:
        word = rng.choice(follow[word]) if rng.random() < 0.85 else rng.choice(words)
        piece = word + (". " if rng.random() < 0.1 else " ")
        out.append(piece)
        size += len(piece)
    return torch.tensor(list("".join(out).encode()[:n_bytes]), dtype=torch.long)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, s, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class TinyGPT(nn.Module):
    def __init__(self, d: int, layers: int, heads: int, seq_len: int, dropout: float):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.tok.weight  # tied
        for module in self.modules():  # GPT-2's init: small weights, so the first loss is ~ln(256)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The same shape for trainready's FLOP model (MFU)."""
    return ModelSpec(name="tiny-gpt", family="gpt", vocab_size=VOCAB, hidden_size=args.d, num_layers=args.layers,
                     num_heads=args.heads, num_kv_heads=args.heads, ffn_hidden_size=4 * args.d, mlp="gelu",
                     norm="layernorm", qkv_bias=True, out_bias=True, mlp_bias=True, tied_embeddings=True,
                     position="learned", max_seq_len=args.seq_len)


def batch_at(corpus: torch.Tensor, index: int, rank: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch depends only on the data position, so restoring the position restores the stream."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + index * 31 + rank)
    starts = torch.randint(0, len(corpus) - args.seq_len - 1, (args.batch,), generator=g)
    rows = torch.stack([corpus[s: s + args.seq_len + 1] for s in starts.tolist()])
    if args.data_delay_ms:
        time.sleep(args.data_delay_ms / 1000)  # a slow loader, for the scaling diagnosis demo
    return rows[:, :-1], rows[:, 1:]


def write_corpus(directory: str, seq_len: int) -> None:
    """The corpus as rows of seq_len + 1 byte tokens (uint16), for `trainready data pack --format tokens`."""
    import os

    import numpy as np

    corpus = make_corpus().numpy().astype(np.uint16)
    rows = corpus[: len(corpus) // (seq_len + 1) * (seq_len + 1)].reshape(-1, seq_len + 1)
    os.makedirs(directory, exist_ok=True)
    np.save(os.path.join(directory, "corpus.npy"), rows)
    print(f"wrote {rows.shape[0]} sequences of {seq_len + 1} tokens to {directory}/corpus.npy")


def stack_rows(rows: list) -> torch.Tensor:
    import numpy as np

    return torch.from_numpy(np.stack(rows)).long()


class StreamedBatches:
    """Batches from a packed dataset through torchdata's StatefulDataLoader; the loader's state
    and the epoch are in the checkpoint, so a resumed run sees exactly the batches it would have."""

    def __init__(self, url: str, sess, args: argparse.Namespace, position: Position):
        from torchdata.stateful_dataloader import StatefulDataLoader

        from trainready.data import ShardedDataset, worker_context

        self.position = position
        self.dataset = ShardedDataset(url, seed=args.seed, shuffle_buffer=256, rank=sess.rank, world_size=sess.world_size)
        self.loader = StatefulDataLoader(self.dataset, batch_size=args.batch, num_workers=args.data_workers,
                                         collate_fn=stack_rows, drop_last=True,
                                         # forkserver, not fork: this process has threads (gloo, checkpoint writers,
                                         # s3fs's event loop) and a forked worker can inherit one of their locks
                                         # held, and hang (seen in CI); with torch and the data stack preloaded,
                                         # or every worker re-imports them on every epoch (docs/data.md)
                                         multiprocessing_context=worker_context() if args.data_workers else None,
                                         # its own generator: starting an epoch's iterator then draws its seed
                                         # from here, not from the global torch RNG that dropout uses (which
                                         # would make a resumed run diverge from an uninterrupted one)
                                         generator=torch.Generator().manual_seed(args.seed))
        self._it = None

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._it is None:
            self.dataset.set_epoch(self.position.epoch)
            self._it = iter(self.loader)
        try:
            rows = next(self._it)
        except StopIteration:  # an epoch is over: the next one, reshuffled
            self.position.next_epoch()
            self._it = None
            return self.next()
        return rows[:, :-1], rows[:, 1:]


def state_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    for index, state in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(state.items()):
            h.update(f"{index}.{key}".encode())
            h.update(value.detach().cpu().contiguous().numpy().tobytes() if torch.is_tensor(value) else repr(value).encode())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8, help="sequences per process per step")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--d", type=int, default=192)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per process (fixed: results depend on it)")
    ap.add_argument("--data-delay-ms", type=float, default=0.0)
    ap.add_argument("--data", help="stream a packed dataset (trainready data pack --format tokens) from this URL")
    ap.add_argument("--data-workers", type=int, default=1, help="DataLoader workers with --data")
    ap.add_argument("--write-corpus", metavar="DIR", help="write the corpus as a .npy of token rows, then exit")
    args = ap.parse_args()
    if args.write_corpus:
        write_corpus(args.write_corpus, args.seq_len)
        return
    torch.set_num_threads(args.threads)

    sess = trainready.init(total_steps=args.steps, model=model_spec(args), seq_len=args.seq_len)
    torch.manual_seed(args.seed)
    model = TinyGPT(args.d, args.layers, args.heads, args.seq_len, args.dropout).to(sess.device)
    net = torch.nn.parallel.DistributedDataParallel(model) if sess.world_size > 1 else model
    sess.watch(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    warmup = max(1, args.steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps))))
    position = Position()
    if args.data:
        from trainready.data import LoaderState

        stream = StreamedBatches(args.data, sess, args, position)
        state = training_state(net, optimizer, scheduler, position=position, data=LoaderState(stream.loader))
    else:
        state = training_state(net, optimizer, scheduler, position=position)
    sess.restore(state)
    corpus = None if args.data else make_corpus()
    if sess.is_main:
        params = sum(p.numel() for p in model.parameters())
        print(f"tiny_gpt: {params / 1e6:.2f}M parameters, {sess.world_size} process(es), starting at step "
              f"{sess.start_step} of {args.steps}", flush=True)

    for step in range(sess.start_step, args.steps):
        with sess.step(tokens=args.batch * args.seq_len) as t:
            x, y = t.data(stream.next() if args.data else batch_at(corpus, position.index, sess.rank, args))
            x, y = x.to(sess.device), y.to(sess.device)
            loss = F.cross_entropy(net(x).view(-1, VOCAB), y.reshape(-1))
            loss.backward()
            with t.optimizer():
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
            position.advance(args.batch * sess.world_size)
            t.log(loss=loss.item(), lr=scheduler.get_last_lr()[0])
        if sess.is_main:
            print(f"step={step} loss={loss.item():.6f}", flush=True)
        sess.maybe_save(step, state)
    sess.finish()
    if sess.is_main:
        print(f"final_state_sha256={state_digest(model, optimizer)}", flush=True)


if __name__ == "__main__":
    main()
