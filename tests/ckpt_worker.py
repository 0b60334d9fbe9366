"""A small deterministic training job for the store tests, one process per rank.

Run directly (single process) or with RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK/
MASTER_ADDR/MASTER_PORT set (gloo). `--hot` may contain `{node}` for a per-node hot tier.
Writes a JSON result (restored step, last step, digest of model+optimizer) to --out on rank 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time

import torch
import torch.distributed as dist

from trainready.store import CheckpointManager, CheckpointManagerOptions, Position, training_state

BATCH = 8


def build(seed: int = 1234):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.1), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    return model, optimizer, scheduler


def dataset():
    gen = torch.Generator().manual_seed(7)
    return torch.randn(4096, 16, generator=gen), torch.randn(4096, 4, generator=gen)


def train_step(model, optimizer, scheduler, position, data, world: int, fsdp: bool = False) -> None:
    x, y = data
    start = position.index % (len(x) - BATCH)
    loss = torch.nn.functional.mse_loss(model(x[start:start + BATCH]), y[start:start + BATCH])
    loss.backward()
    if world > 1 and not fsdp:  # FSDP2 reduce-scatters (averages) gradients itself
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
    position.advance(BATCH)


def _full(value):
    return value.full_tensor() if type(value).__name__ == "DTensor" else value


def digest(model, optimizer) -> str:
    """Hash of every parameter and optimizer value (full tensors, gathered if sharded)."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(_full(p).detach().contiguous().numpy().tobytes())
    for group in optimizer.state.values():
        for key in sorted(group):
            value = _full(group[key])
            h.update(value.detach().contiguous().numpy().tobytes() if torch.is_tensor(value) else repr(value).encode())
    return h.hexdigest()


def reference_digest(steps: int) -> str:
    """The uninterrupted run's model+optimizer after `steps` steps (single process)."""
    model, optimizer, scheduler = build()
    position, data = Position(), dataset()
    torch.manual_seed(99)
    for _ in range(steps):
        train_step(model, optimizer, scheduler, position, data, 1)
    return digest(model, optimizer)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hot", required=True)
    ap.add_argument("--archive")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--save-every", type=int, default=1)
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--keep-hot", type=int, default=2)
    ap.add_argument("--keep-archive", type=int)
    ap.add_argument("--out")
    ap.add_argument("--run-id")
    ap.add_argument("--close-timeout", type=float, default=60)
    ap.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2 (DTensor state)")
    ap.add_argument("--preempt", type=float, help="install the SIGTERM handler with this deadline (s); steps take 20 ms")
    ap.add_argument("--ready", help="file to create once training has started")
    ap.add_argument("--wait-each", action="store_true", help="wait for each upload (exact fault points)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    node = os.environ.get("GROUP_RANK", "0")
    model, optimizer, scheduler = build()
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)  # parameters become DTensors sharded over the ranks (CPU, gloo)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    position, data = Position(), dataset()
    torch.manual_seed(99)
    state = training_state(model, optimizer, scheduler, position=position)
    options = CheckpointManagerOptions(keep_hot=args.keep_hot, keep_archive=args.keep_archive, async_save=not args.sync,
                                       retry_initial_s=0.1, retry_max_s=0.5,
                                       save_interval_steps=args.save_every if args.preempt else None)
    mgr = CheckpointManager(args.hot.format(node=node), args.archive, options, run_id=args.run_id)
    if args.preempt:
        mgr.install_preemption_handler(deadline_s=args.preempt)
    details = mgr.restore_details(state)
    start = details.step if details else 0
    restored_digest = digest(model, optimizer)  # collective when sharded: every rank computes it
    for step in range(start + 1, args.steps + 1):
        train_step(model, optimizer, scheduler, position, data, world, args.fsdp)
        if args.preempt:
            if args.ready and step == start + 1:
                open(args.ready, "w").close()
            time.sleep(0.02)
            if mgr.should_save(step):
                mgr.save(step, state)  # after a SIGTERM: save and upload, then the loop exits 143
            if mgr.reached_preemption(step):
                sys.exit(mgr.PREEMPTION_EXIT_CODE)
            continue
        if step % args.save_every == 0:
            mgr.save(step, state)
            if args.wait_each:
                mgr.wait()
    mgr.close(timeout_s=args.close_timeout)
    final_digest = digest(model, optimizer)
    if args.out and (world == 1 or dist.get_rank() == 0):
        with open(args.out, "w") as handle:
            json.dump({"restored": details.step if details else None, "tier": details.tier if details else None,
                       "skipped": list(details.skipped) if details else [], "restored_digest": restored_digest,
                       "final_step": args.steps, "digest": final_digest, "position": position.index,
                       "generation": mgr.generation}, handle)
    if world > 1:
        del mgr, state, optimizer  # nothing holding tensors of pending gloo work at exit
        dist.barrier()
        dist.destroy_process_group()
    return 0


EXIT_STORAGE_FULL = 3  # the test tells "every rank raised StorageFullError" from any other failure


if __name__ == "__main__":
    try:
        code = main()
    except Exception as error:  # noqa: BLE001 - reported by exit code; the traceback goes to the log
        import traceback

        from trainready.store.errors import StorageFullError

        traceback.print_exc()
        code = EXIT_STORAGE_FULL if isinstance(error, StorageFullError) else 1
    # Skip interpreter teardown, on success and on error alike. With the process group still alive (an
    # exception skipped destroy_process_group) or FSDP2 modules alive after it, torch (2.13) sometimes
    # aborts there ("terminate called without an active exception"), typically when the peer that
    # hosts the TCPStore has already exited: the exit code becomes SIGABRT. Seen in CI under load.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
