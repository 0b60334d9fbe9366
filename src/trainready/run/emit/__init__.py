"""Launch files for a `trainready run` job: `--emit slurm | skypilot | torchrun`.

`emit(kind, spec)` renders the text; it runs nothing and touches no file. The output is
stable (no dates, sorted environment), so the same spec always gives the same bytes and
an emitted file can be kept in git and diffed.

* slurm: an sbatch script; srun starts one `trainready run` launcher per node.
* skypilot: a SkyPilot task YAML whose `run` starts one `trainready run` per node.
* torchrun: one block of plain `python -m torch.distributed.run` per node, with the
  launcher's settings as `TRAINREADY_*` environment variables (no launcher involved).
* k8s / jobset: a Kubeflow Trainer v2 TrainJob, or a plain JobSet (k8s.py).
* pcluster: an AWS ParallelCluster 3 cluster config for the job (pcluster.py).

One module per engine, each with `render`; ENGINES maps a kind to it. The engines share the job (spec.py),
its nodes (node.py) and the words they write (text.py), and never import this package: no import circle.

Every user-supplied word is shell-quoted (`shlex.quote`, or bash `$'...'` for control
characters), and YAML scalars are quoted where needed, so commands with spaces, quotes,
`$` or newlines reach the training process unchanged. See docs/emit.md.
"""

from __future__ import annotations

from collections.abc import Callable

from trainready.errors import UsageError

from . import k8s, pcluster, skypilot, slurm, torchrun
from .spec import EMIT_KINDS, EmitKind, EmitSpec, build_spec, validate
from .text import sh_quote

__all__ = ["EMIT_KINDS", "ENGINES", "EmitKind", "EmitSpec", "build_spec", "emit", "sh_quote"]

ENGINES: dict[str, Callable[[EmitSpec], str]] = {
    "slurm": slurm.render,
    "skypilot": skypilot.render,
    "torchrun": torchrun.render,
    "k8s": lambda spec: k8s.render("k8s", spec),
    "jobset": lambda spec: k8s.render("jobset", spec),
    "pcluster": pcluster.render,
}
"""Each --emit kind's renderer: EmitSpec -> the launch file's text."""


def emit(kind: EmitKind, spec: EmitSpec) -> str:
    """The launch file of `kind` for `spec`, as text ending in a newline."""
    validate(spec)  # also covers specs made with model_construct or changed after creation
    render = ENGINES.get(kind)
    if render is None:
        raise UsageError(f"unknown --emit kind {kind!r}: choose one of {', '.join(EMIT_KINDS)}")
    return render(spec)
