"""A training loop with tiered checkpoints, runnable anywhere:

    python examples/train_with_checkpoints.py --hot /tmp/ckpt --archive /tmp/archive
    torchrun --nproc-per-node 2 examples/train_with_checkpoints.py --hot /tmp/ckpt --archive s3://bucket/run

Kill it at any moment (Ctrl-C, kill -9, SIGTERM) and start it again: it resumes from the
newest checkpoint that verifies, on the same data position and RNG state. With the preemption
handler (the default) a SIGTERM makes every rank save once more, wait for the upload and exit
143; `--no-preemption-handler` leaves SIGTERM to kill the process (the last committed
checkpoint is what the next run resumes from).
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


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Every parameter and optimizer value, hashed: two runs that agree here agree bit for bit."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    for group in optimizer.state.values():
        for key in sorted(group):
            value = group[key]
            h.update(value.detach().contiguous().numpy().tobytes() if torch.is_tensor(value) else repr(value).encode())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hot", required=True, help="local directory (the node's NVMe)")
    ap.add_argument("--archive", help="shared path or s3://bucket/prefix")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--sync", action="store_true", help="save synchronously (default: stage and write in the background)")
    ap.add_argument("--when-busy", choices=("wait", "skip"), default="wait",
                    help="a save while the previous one is still being written: wait for it, or skip this one")
    ap.add_argument("--no-preemption-handler", action="store_true", help="let SIGTERM kill the process")
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds of pretend work per step")
    ap.add_argument("--out", help="rank 0 writes the restored step and a digest of the final state here (JSON)")
    ap.add_argument("--progress", help="rank 0 writes the step it has reached here, every step")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(device)
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    position = Position()
    state = training_state(model, optimizer, scheduler, position=position)

    options = CheckpointManagerOptions(keep_hot=2, save_interval_steps=args.save_every, async_save=not args.sync,
                                       when_busy=args.when_busy)
    with CheckpointManager(args.hot, args.archive, options) as mgr:
        if not args.no_preemption_handler:
            mgr.install_preemption_handler(deadline_s=100)
        restored = mgr.restore(state)
        start = (restored or 0) + 1
        logging.info("starting at step %d (data position %s)", start, position)
        for step in range(start, args.steps + 1):
            generator = torch.Generator().manual_seed(position.index)  # the data follows the position
            x = torch.randn(32, 64, generator=generator).to(device)
            loss = torch.nn.functional.mse_loss(model(x), x)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            position.advance(32)
            time.sleep(args.step_sleep)
            if args.progress and rank == 0:
                with open(args.progress, "w") as handle:
                    handle.write(str(step))
            if mgr.should_save(step):
                mgr.save(step, state, metadata={"loss": loss.item()})
            if mgr.reached_preemption(step):  # saved, uploaded and closed: the process decides how to exit
                logging.info("preempted: stopping after step %d", step)
                sys.exit(mgr.PREEMPTION_EXIT_CODE)
        mgr.save(args.steps, state)
    if args.out and rank == 0:
        inner = model.module if hasattr(model, "module") else model
        with open(args.out, "w") as handle:
            json.dump({"restored": restored, "steps": args.steps, "digest": digest(inner, optimizer)}, handle)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
