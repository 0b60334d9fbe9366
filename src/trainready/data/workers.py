"""`worker_context()`: the multiprocessing context to start DataLoader workers with.

    loader = StatefulDataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=worker_context())

forkserver, not fork: a training process has threads (gloo/NCCL, checkpoint writers, s3fs's event
loop), and a forked worker can inherit a lock one of them held and hang. But a bare forkserver
preloads only the main script, and only when it was started as a file: every worker then imports
torch (and, for `python -m pkg.train`, the training module with all it imports) again, on every
iter(), i.e. every epoch and every resume: seconds per worker instead of milliseconds
(`python bench/data_first_batch.py` measures it; figures in docs/data.md). This context's server
preloads the main script or module, torch, torch.utils.data, trainready.data.dataset, torchdata's
StatefulDataLoader and the S3 client if this process has loaded it, plus `modules` you name; it
starts right away, so the imports run while you build the model.

persistent_workers=True would also avoid the restarts, but workers then keep the epoch they
started with: ShardedDataset.set_epoch() reaches workers only when they start.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.forkserver as forkserver
import os
import sys
from multiprocessing.context import BaseContext

log = logging.getLogger(__name__)
PRELOAD = ("torch", "torch.utils.data", "trainready.data.dataset", "torchdata.stateful_dataloader")
IF_LOADED = ("numpy", "s3fs")  # preloaded when this process uses them (a remote dataset: s3fs)
DEFAULT_WORKERS = 4
WORKERS_PER_CPU = 4  # reading is mostly waiting (S3 GETs), so a few workers per core still help; more only time-slice
MAX_WORKERS = 256    # whatever the CPU count: each worker costs the main process ~3 open files (the usual limit is 1024)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as torch counts them), else os.cpu_count()."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def max_workers() -> int:
    """The most DataLoader workers `data bench` starts here: 4 per usable CPU, never above 256."""
    return min(WORKERS_PER_CPU * usable_cpus(), MAX_WORKERS)


def default_workers() -> int:
    """4 workers, or one per usable CPU when there are fewer."""
    return min(DEFAULT_WORKERS, usable_cpus())


def preload_modules(*modules: str) -> list[str]:
    """What worker_context() preloads: the main script (its file, as multiprocessing does by
    default) and, for `python -m pkg.train`, the module by name, then the data stack."""
    names = ["__main__"]
    main_name = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None)
    if main_name and main_name != "__main__" and not main_name.endswith(".__main__"):
        names.append(main_name)  # imported under its own name: its imports are cached, its guarded code does not run
    names += [*PRELOAD, *(m for m in IF_LOADED if m in sys.modules), *modules]
    return list(dict.fromkeys(names))


def worker_context(*modules: str, start: bool = True) -> BaseContext:
    """A forkserver context whose server has the data stack preloaded (see the module docstring).

    Call it before the first loader starts its workers: a forkserver already running keeps what
    it preloaded (this logs a warning then). A module that fails to import is skipped by the
    server (multiprocessing ignores ImportError there)."""
    names = preload_modules(*modules)
    server = getattr(forkserver, "_forkserver", None)
    running = getattr(server, "_forkserver_pid", None) is not None
    loaded = list(getattr(server, "_preload_modules", []) or [])
    if running and any(name not in loaded for name in names):
        log.warning("the forkserver is already running without preloading %s: DataLoader workers will import "
                    "them on every start; call trainready.data.worker_context() before the first loader iterates",
                    ", ".join(n for n in names if n not in loaded))
    elif not running:
        forkserver.set_forkserver_preload(names)
        if start:
            forkserver.ensure_running()  # starts importing now, while the caller goes on
    return multiprocessing.get_context("forkserver")
