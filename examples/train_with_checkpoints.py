"""A training loop with tiered checkpoints, runnable anywhere:

    python examples/train_with_checkpoints.py --hot /tmp/ckpt --archive /tmp/archive
    torchrun --nproc-per-node 2 examples/train_with_checkpoints.py --hot /tmp/ckpt --archive s3://bucket/run

Kill it at any moment (Ctrl-C, kill -9, SIGTERM) and start it again: it resumes from the
newest checkpoint that verifies, on the same data position and RNG state.
"""

from __future__ import annotations

import argparse
import logging
import os

import torch
import torch.distributed as dist

from trainready.store import CheckpointManager, Position, training_state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hot", required=True, help="local directory (the node's NVMe)")
    ap.add_argument("--archive", help="shared path or s3://bucket/prefix")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=20)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(device)
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    position = Position()
    state = training_state(model, optimizer, scheduler, position=position)

    with CheckpointManager(args.hot, args.archive, keep_hot=2, save_interval_steps=args.save_every) as mgr:
        mgr.install_preemption_handler(deadline_s=100)
        start = (mgr.restore(state) or 0) + 1
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
            if mgr.should_save(step):
                mgr.save(step, state, metadata={"loss": loss.item()})
        mgr.save(args.steps, state)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
