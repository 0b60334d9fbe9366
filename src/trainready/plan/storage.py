"""The storage plan of a training setup: checkpoint size, hot tier, archive, dataset reads.

The seeds call this the storage ratio: how much local NVMe and network a job needs for its
checkpoints and data, against what the instance has. Local NVMe throughput is not in any
source we trust, so it is reported as unknown: `trainready check --deep` measures it.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from .setup import Setup

IN_FLIGHT = 1  # one more checkpoint being written while `keep_hot` committed ones stay
ARCHIVE_KEEP: int | None = None
"""Checkpoints the archive keeps: `trainready run` builds its CheckpointManager without
`keep_archive`, whose default None keeps every archived checkpoint (store/manager.py)."""


class StoragePlan(BaseModel):
    checkpoint_gb: float
    checkpoint_gb_per_node: float
    hot_tier_need_gb_per_node: float
    hot_tier_have_gb_per_node: float | None
    hot_tier_fits: bool | None
    write_gbps_needed_per_node: float
    write_gbps_have_per_node: float | None
    archive_upload_gbps_needed_per_node: float
    network_gbps_per_node: float | None
    archive_growth_gb_per_day: float = Field(description="while the job runs; see archive_total_gb for the run")
    hot_tier_keeps: int = Field(description="committed checkpoints kept on the hot tier (keep_hot), plus one in flight")
    archive_keeps: int | None = Field(description="checkpoints the archive keeps; None: every one")
    checkpoints_written: int | None = Field(description="over the run (one per interval and the last), with --tokens")
    archive_total_gb: float | None = Field(description="what the archive holds at the end of the run, with --tokens")
    archive_gb_per_billion_tokens: float = Field(description="archive growth per 1B tokens trained (no retention)")
    checkpoint_interval_s: float
    dataset_read_mb_per_s: float
    dataset_bytes_per_token: int
    notes: list[str]


def archive_checkpoints(train_hours: float, interval_s: float) -> int:
    """Checkpoints a run of `train_hours` writes: one per interval, and the last at the end."""
    return math.floor(train_hours * 3600 / max(1.0, interval_s)) + 1


def storage_plan(s: Setup, checkpoint_bytes: float, interval_s: float, tokens_per_s: float, *,
                 train_hours: float | None = None) -> StoragePlan:
    ckpt_gb = checkpoint_bytes / 1e9
    per_node = ckpt_gb / s.nodes
    need = per_node * (s.keep_hot + IN_FLIGHT)
    inst = s.instance
    have = inst.nvme_total_gb if inst else None
    notes: list[str] = []
    if inst is not None and have == 0:
        notes.append(f"{inst.name} has no local NVMe: the hot tier falls back to EBS "
                     f"({inst.ebs_mbps / 1000 if inst.ebs_mbps else '?'} Gbps)")
    fits = None if have in (None, 0) else need <= have
    if inst is not None and have is None:
        notes.append(f"local NVMe of {inst.name} is not in the catalog (unknown)")
    # background writes of one checkpoint should finish within half the interval
    write_needed = per_node / max(1.0, interval_s / 2)
    net = inst.network_gbps / 8 if (inst and inst.network_gbps) else (s.inter_node_gbps / 8 if s.inter_node_gbps else None)
    upload_needed = per_node / max(1.0, interval_s)
    bytes_per_token = 2 if s.model.vocab_size <= 65536 else 4  # uint16 / uint32 token ids
    dataset_mb_s = tokens_per_s / s.nodes * bytes_per_token / 1e6
    notes.append("local NVMe write throughput is not published: measure it with `trainready check --deep --hot-dir`")
    written = archive_checkpoints(train_hours, interval_s) if train_hours is not None else None
    kept = None if written is None else (written if ARCHIVE_KEEP is None else min(written, ARCHIVE_KEEP))
    per_btok = ckpt_gb * 1e9 / tokens_per_s / max(1.0, interval_s) if tokens_per_s > 0 else 0.0
    return StoragePlan(checkpoint_gb=ckpt_gb, checkpoint_gb_per_node=per_node, hot_tier_need_gb_per_node=need,
                       hot_tier_have_gb_per_node=have, hot_tier_fits=fits,
                       write_gbps_needed_per_node=write_needed, write_gbps_have_per_node=None,
                       archive_upload_gbps_needed_per_node=upload_needed, network_gbps_per_node=net,
                       archive_growth_gb_per_day=ckpt_gb * 86400 / max(1.0, interval_s),
                       hot_tier_keeps=s.keep_hot, archive_keeps=ARCHIVE_KEEP, checkpoints_written=written,
                       archive_total_gb=None if kept is None else kept * ckpt_gb,
                       archive_gb_per_billion_tokens=per_btok,
                       checkpoint_interval_s=interval_s, dataset_read_mb_per_s=dataset_mb_s,
                       dataset_bytes_per_token=bytes_per_token, notes=notes)
