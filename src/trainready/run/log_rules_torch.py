"""Rules for CUDA OOM, worker deaths (SIGKILL, host OOM, torchrun summaries), rendezvous,
world-size mismatches and NaN loss (see log_rules_base.py for the machinery)."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from .log_rules_base import (  # noqa: F401
    CHILD_FAILED,
    NOT_FATAL,
    Detail,
    Details,
    Finding,
    Line,
    Rule,
    _after,
    _gib,
    _int,
    _plural,
    _rank_list,
    _rank_of,
)

# ------------------------------------------------------------------------ 5. CUDA OOM

_SIZE = r"(\d+(?:\.\d+)?) ?(bytes|[KMGT]iB)"
OOM_FRAGMENTED = 0.10  # reserved-but-unallocated above this share of the GPU: fragmentation


def _oom_fixes(d: Details) -> list[str]:
    fixes = []
    if _fragmented(d):
        fixes.append(f"Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: {d['reserved_unallocated_gib']} GiB is "
                     "reserved by PyTorch but unallocated, i.e. the allocator's free blocks are too fragmented to use.")
    return fixes + [
        "Turn on activation checkpointing (recompute activations in the backward pass): the largest saving for long "
        "sequences.",
        "Halve the micro-batch and double gradient accumulation to keep the same global batch.",
        "Shard the model states: FSDP or ZeRO-3 instead of DDP (ZeRO-1/2 shard only optimizer states and gradients).",
        "Offload optimizer states to host RAM (slower; needs host memory for every rank's share).",
        "Check the plan before launching: `trainready estimate` shows the memory per GPU of a setup and "
        "`trainready plan` searches for one that fits; `trainready diagnose --job job.toml` adds that estimate here.",
    ]


def _fragmented(d: Details) -> bool:
    total, spare = d.get("total_gib"), d.get("reserved_unallocated_gib")
    return isinstance(total, float) and isinstance(spare, float) and total > 0 and spare > OOM_FRAGMENTED * total


def _oom_explanation(d: Details) -> str:
    if d["total_gib"] is None:
        return ("A CUDA allocation failed: the GPU ran out of memory for this setup's weights, gradients, optimizer "
                "states, activations and temporary buffers.")
    text = f"GPU {d['gpu'] if d['gpu'] is not None else '?'} ({d['total_gib']:g} GiB) ran out of memory"
    text += f" allocating {d['tried_gib']:g} GiB" if d["tried_gib"] is not None else ""
    text += f" with {d['free_gib']:g} GiB free" if d["free_gib"] is not None else ""
    text += "."
    if d["allocated_gib"] is not None:
        text += f" Tensors held {d['allocated_gib']:g} GiB"
        if d["reserved_unallocated_gib"] is not None:
            text += f" and PyTorch's caching allocator kept {d['reserved_unallocated_gib']:g} GiB reserved but unused"
        text += "."
    if _fragmented(d):
        text += " That much reserved-but-unused memory means fragmentation: expandable segments usually recover it."
    return text + (" At its peak this setup needed more than the GPU had left for weights, gradients, optimizer "
                   "states, activations and temporary buffers.")


class CudaOomRule(Rule):
    keywords = ("out of memory", "OutOfMemoryError")
    _oom = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|Cuda failure 'out of memory'")
    _fields = {
        "tried_gib": re.compile(rf"Tried to allocate {_SIZE}"),
        "total_gib": re.compile(rf"total capaci?ty of {_SIZE}"),  # "capacty" in torch 2.1
        "free_gib": re.compile(rf"of which {_SIZE} is free"),
        "process_in_use_gib": re.compile(rf"this process has {_SIZE} memory in use"),
        "allocated_gib": re.compile(rf"{_SIZE} is allocated by PyTorch"),
        "reserved_unallocated_gib": re.compile(rf"{_SIZE} is reserved by PyTorch but unallocated"),
    }
    _gpu = re.compile(r"GPU (\d+) has a total capac|\(GPU (\d+);")
    _old = re.compile(rf"\(GPU \d+; {_SIZE} total capacity; {_SIZE} already allocated; {_SIZE} free; "
                      rf"{_SIZE} (?:reserved in total by PyTorch|cached)\)")

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.records: list[Details] = []
        self.ranks: set[int] = set()
        self.pending = 0

    def _parse(self, text: str, record: Details) -> None:
        for name, pattern in self._fields.items():
            if record.get(name) is None and (m := pattern.search(text)):
                record[name] = _gib(m.group(1), m.group(2))
        if record.get("gpu") is None and (m := self._gpu.search(text)):
            record["gpu"] = _int(m.group(1) or m.group(2))
        if m := self._old.search(text):  # the pre-2.1 wording counts allocated memory inside "reserved"
            total, allocated, free, reserved = (_gib(m.group(i), m.group(i + 1)) for i in (1, 3, 5, 7))
            record.update(total_gib=total, allocated_gib=allocated, free_gib=free,
                          reserved_unallocated_gib=round(max(reserved - allocated, 0.0), 2))

    def feed(self, line: Line) -> None:
        if self._oom.search(line.text):
            self.lines.append(line)
            self.records.append({})
            self.pending = 2  # the numbers may continue on the next lines
            if (rank := _rank_of(line.text)) is not None:
                self.ranks.add(rank)
        elif self.pending:
            self.pending -= 1
        else:
            return
        self._parse(line.text, self.records[-1])
        self.wants_next = self.pending > 0 and self.records[-1].get("total_gib") is None

    def finish(self) -> list[Finding]:
        if not self.lines:
            return []
        best = max(self.records, key=lambda r: sum(v is not None for v in r.values()))
        keys = ("tried_gib", "gpu", "total_gib", "free_gib", "allocated_gib", "reserved_unallocated_gib",
                "process_in_use_gib")
        d: Details = {k: best.get(k) for k in keys}
        d["ranks"] = _rank_list(self.ranks) or None
        return [Finding("cuda.oom", "CUDA out of memory", "error", _oom_explanation(d), _oom_fixes(d),
                        self.lines, len(self.lines), d)]


# ------------------------------- 6 + 10. how workers died: SIGKILL / host OOM, torchrun summary

KILLED_FIXES = (
    "Confirm on the node: `sudo dmesg -T | grep -i -E 'killed process|out of memory'` (or `journalctl -k`); in a "
    "container also check its memory limit (`kubectl describe pod` shows OOMKilled).",
    "Use fewer or lighter dataloader workers (num_workers, prefetch_factor), and do not load the whole dataset or "
    "checkpoint into RAM on every rank.",
    "CPU offload (ZeRO/FSDP offload of optimizer states or parameters) needs host RAM for every rank's share: "
    "offload less or not at all. `trainready estimate` shows the host RAM a job needs per node, `trainready check "
    "--job job.toml` compares it with the node.",
    "Keep pinned host memory modest (pin_memory buffers cannot be swapped out).",
)
_SIGNALS = {-6: "a C++ abort, often the NCCL watchdog taking the process down after a collective failed or timed out",
            -7: "a bus error, often /dev/shm too small for dataloader workers in a container",
            -11: "a crash in native code (a CUDA extension, a driver or library mismatch)",
            -15: "stopped from outside: the scheduler, a spot interruption, or torchrun stopping it after another "
                 "worker failed"}


def signal_name(exitcode: int | None) -> str | None:
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except (ValueError, OverflowError):
        return f"signal {-exitcode}"


def _killed_explanation(d: Details) -> str:
    who = f"Worker rank {d['rank']}" if d["rank"] is not None else "A worker process"
    text = (f"{who} was killed with SIGKILL (signal 9), which no program can catch, so it left no traceback. That is "
            "almost always the Linux out-of-memory killer reclaiming host RAM (CPU offload, many or large dataloader "
            "workers, pinned buffers, every rank loading a full checkpoint), or an external kill: a container "
            "memory limit, the scheduler, a spot reclaim.")
    if d["kernel_oom"] == "yes":
        rss = f" holding {d['anon_rss_gib']:g} GiB of RAM" if isinstance(d["anon_rss_gib"], float) else ""
        text += f" The kernel log confirms it: the OOM killer ended process {d['pid']} ({d['process']}){rss}."
    return text


def _child_explanation(d: Details) -> str:
    who = f"worker rank {d['rank']} (local rank {d['local_rank']})" if d["rank"] is not None \
        else f"the worker with local rank {d['local_rank']}"
    where = f" on {d['host']}" if d["host"] else ""
    code = d["exitcode"]
    how = f"killed by {d['signal']}" if d["signal"] else f"exit code {code}"
    text = (f"torchrun reports that {who}{where} failed first ({how}). torchrun only sees how the process ended; "
            "the reason is in that worker's own output: its stderr.log in torchrun's --log-dir "
            f"(<run-id>_*/attempt_<n>/{d['local_rank']}/stderr.log), or its [rank{d['rank'] if d['rank'] is not None else 'N'}] "
            "lines in the combined output.")
    if isinstance(code, int) and code in _SIGNALS:
        text += f" {d['signal']} means {_SIGNALS[code]}."
    if d["last_error"]:
        text += f" Its last error: {d['last_error']}"
    return text


def _child_fixes(d: Details) -> list[str]:
    who = f"rank {d['rank']}" if d["rank"] is not None else f"local rank {d['local_rank']}"
    return [f"Read {who}'s stderr first: it holds the root cause; other failures in the summary are usually "
            "torchrun stopping the remaining workers.",
            "Run `trainready diagnose` on the whole torchrun --log-dir directory: it reads every rank's stdout.log "
            "and stderr.log.",
            "To get the Python traceback into this summary, decorate the training entry point with "
            "@torch.distributed.elastic.multiprocessing.errors.record."]


@dataclass
class _Failure:
    section: str
    line: Line
    rank: int | None = None
    local_rank: int | None = None
    exitcode: int | None = None
    pid: int | None = None
    host: str | None = None
    error_file: str | None = None
    exit_line: Line | None = None


class WorkerDeathRule(Rule):
    keywords = ("Root Cause", "Failures:", "]:", "local_rank", "exitcode", "error_file", "host", "=" * 20,
                "of memory: Kill", "killed by signal", "return code = -9", " Killed", "Error:", "Exception:")
    _root = re.compile(r"Root Cause\b")
    _failures = re.compile(r"\bFailures:\s*$")
    _index = re.compile(r"^\W{0,40}\[(\d+)\]:\s*$")
    _end = re.compile(r"={20,}\s*$")
    _rank = re.compile(r"\brank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
    _exit = re.compile(r"\bexitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
    _host = re.compile(r"\bhost\s*:\s*(\S+)")
    _error_file = re.compile(r"\berror_file\s*:\s*(\S+)")
    _agent = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
    _kernel = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Kill(?:ed)? process (\d+) \(([^)]*)\)")
    _rss = re.compile(r"anon-rss:\s*(\d+)\s*kB")
    _other_kill = re.compile(r"DataLoader worker \(pids?\)? ?[\d, ]*\)? is killed by signal: Killed"
                             r"|exits with return code = -9|line \d+: +\d+ Killed\b")
    _exception = re.compile(r"^(?:\[[^\]]{0,40}\]:?\s*)*([A-Za-z_][\w.]*(?:Error|Exception)):\s+\S")

    def __init__(self) -> None:
        self.section: dict[str, str | None] = {}
        self.failures: list[_Failure] = []
        self.agent: list[tuple[Line, int, int, int]] = []
        self.kills: list[Line] = []
        self.kernel: Details = {}
        self.exceptions: list[Line] = []

    def feed(self, line: Line) -> None:
        text, file = line.text, line.file
        if self._root.search(text):
            self.section[file] = "root"
        elif self._failures.search(text):
            self.section[file] = "failures"
        elif self._end.search(text):
            self.section[file] = None
        elif (section := self.section.get(file)) and self._index.search(text):
            self.failures.append(_Failure(section, line))
        elif section and self.failures and self.failures[-1].line.file == file:
            self._field(self.failures[-1], line)
        if m := self._agent.search(text):
            self.agent.append((line, _int(m.group(1)), _int(m.group(2)), _int(m.group(3))))
        elif m := self._kernel.search(text):
            self.kills.append(line)
            rss = self._rss.search(text)
            self.kernel = self.kernel or {"pid": _int(m.group(1)), "process": m.group(2)[:60],
                                          "anon_rss_gib": round(_int(rss.group(1)) / 2**20, 1) if rss else None}
        elif self._other_kill.search(text):
            self.kills.append(line)
        elif (m := self._exception.search(text)) and not m.group(1).endswith("ChildFailedError"):
            self.exceptions.append(line)

    def _field(self, failure: _Failure, line: Line) -> None:
        text = line.text
        if m := self._rank.search(text):
            failure.rank, failure.local_rank = _int(m.group(1)), _int(m.group(2))
        elif m := self._exit.search(text):
            failure.exitcode, failure.pid, failure.exit_line = _int(m.group(1)), _int(m.group(2)), line
        elif m := self._host.search(text):
            failure.host = m.group(1)[:120]
        elif (m := self._error_file.search(text)) and m.group(1) != "<N/A>":
            failure.error_file = m.group(1)[:200]

    def _last_error(self, root: _Failure) -> str | None:
        """The worker's own last exception: from its stderr.log in a torchrun log dir, or its [rankN] lines."""
        own = [x for x in self.exceptions if root.local_rank is not None
               and x.file.replace("\\", "/").endswith(f"/{root.local_rank}/stderr.log")]
        if not own and root.rank is not None:
            own = [x for x in self.exceptions if f"[rank{root.rank}]" in x.text]
        return own[-1].text.strip()[:240] if own else None

    def _killed(self, roots: list[_Failure]) -> Finding | None:
        lines = [f.exit_line for f in roots if f.exitcode == -9 and f.exit_line]
        lines += [line for line, code, _, _ in self.agent if code == -9] + self.kills
        if not lines:
            return None
        root = next((f for f in roots if f.exitcode == -9), None)
        agent = next(((lr, pid) for _, code, lr, pid in self.agent if code == -9), (None, None))
        pid = root.pid if root else agent[1] if agent[1] is not None else self.kernel.get("pid")
        d: Details = {"rank": root.rank if root else None, "local_rank": root.local_rank if root else agent[0],
                      "pid": pid, "host": root.host if root else None, "kernel_oom": "yes" if self.kernel else "no",
                      "process": self.kernel.get("process"), "anon_rss_gib": self.kernel.get("anon_rss_gib")}
        lines = sorted(set(lines), key=lambda x: x.position)
        return Finding("host.oom-killed", "A worker was killed (SIGKILL): most likely out of host memory", "error",
                       _killed_explanation(d), list(KILLED_FIXES), lines, len(lines), d)

    def _child_failed(self, roots: list[_Failure]) -> Finding | None:
        others = [f for f in roots if f.exitcode != -9]
        agent = [_Failure("root", line, local_rank=lr, exitcode=code) for line, code, lr, _ in self.agent if code != -9]
        failures = others or ([] if roots else agent)
        if not failures:
            return None
        root = failures[0]
        d: Details = {"rank": root.rank, "local_rank": root.local_rank, "exitcode": root.exitcode,
                      "signal": signal_name(root.exitcode), "host": root.host, "error_file": root.error_file,
                      "last_error": self._last_error(root)}
        return Finding(CHILD_FAILED, "torchrun: a worker process failed", "warning", _child_explanation(d),
                       _child_fixes(d), [root.exit_line or root.line], len(failures), d)

    def finish(self) -> list[Finding]:
        roots = [f for f in self.failures if f.section == "root" and f.exitcode is not None]
        return [f for f in (self._killed(roots), self._child_failed(roots)) if f is not None]


# -------------------------------------------------------------- 7. rendezvous / TCPStore

def _port_in_use(d: Details) -> tuple[str, list[str]]:
    port = d.get("port") or "PORT"
    return (f"The rendezvous store could not listen on port {port}: another process on this node already uses it, "
            "usually a previous run (or another job) that is still alive.",
            [f"Find and stop the old process: `ss -ltnp | grep :{port}`.",
             "Or give this job its own port, the same on every node: --rdzv-endpoint HOST:PORT (c10d) or "
             "--master-port PORT (static rendezvous); two jobs on one node need two ports.",
             "Only the node whose address is in --rdzv-endpoint (or --master-addr) hosts the store."])


def _unreachable(d: Details) -> tuple[str, list[str]]:
    where = f"{d['host']}:{d['port']}" if d.get("host") else "the rendezvous endpoint"
    return (f"This node could not connect to the rendezvous store at {where}: the head node was not up yet, the "
            "address is not reachable from this node, or the port is blocked.",
            ["Use the head node's private IP, reachable from every node, in --rdzv-endpoint / --master-addr; not "
             "localhost or a public address.",
             "Start the head node's torchrun too (it hosts the store) and check from a worker: `nc -zv HOST PORT`.",
             "The security group must allow all traffic to and from itself (EFA needs that anyway); check host "
             "firewalls.",
             "Every node must use the same --rdzv-endpoint, --rdzv-id and --rdzv-backend."])


def _rdzv_timeout(d: Details) -> tuple[str, list[str]]:
    count = f" ({d['joined']} of {d['expected']} joined)" if d.get("expected") else ""
    return (f"Not every node joined the rendezvous before the timeout{count}: a node was not started, crashed "
            "before joining, could not reach the endpoint, or was started with different settings.",
            ["Check that every node was started and look at the log of the one that is missing.",
             "All nodes must use the same --nnodes, --nproc-per-node, --rdzv-id and --rdzv-endpoint: a node with a "
             "different --nnodes waits for a different number of peers.",
             "For slow starts (large container pulls), raise the timeout: --rdzv-conf join_timeout=1800 (c10d) or "
             "--rdzv-conf timeout=1800 (static)."])


RDZV = {"rdzv.port-in-use": ("Rendezvous port already in use", _port_in_use),
        "rdzv.unreachable": ("Rendezvous endpoint unreachable", _unreachable),
        "rdzv.timeout": ("Rendezvous timed out waiting for nodes", _rdzv_timeout)}


class RendezvousRule(Rule):
    keywords = ("server socket", "already in use", "EADDRINUSE", "Rendezvous", "DistNetworkError", "client socket",
                "TCP client", "[c10d]", "waiting for clients", "torchelastic/")
    _in_use = re.compile(r"(?:server socket has failed to (?:listen|bind)|TCPStore).{0,400}"
                         r"(?:EADDRINUSE|[Aa]ddress already in use|errno: 98)|^\s*RuntimeError: Address already in use")
    _port = re.compile(r"port: (\d+)|:(\d+) \(errno: 98")
    _unreachable = re.compile(r"RendezvousConnectionError|client socket has timed out after \S+ while trying to connect"
                              r"|client socket has failed to connect|TCP client failed to connect"
                              r"|\[c10d\].{0,200}(?:Connection refused|No route to host|Name or service not known)")
    _endpoint = re.compile(r"connect to \(?\[?([\w.:-]+?)\]?(?:, |:)(\d+)\)?|to host ([\w.-]+):(\d+)")
    _timeout = re.compile(r"RendezvousTimeoutError|waiting for clients\. \d+/\d+ clients joined"
                          r"|wait timeout after \d+ms, keys: \S*torchelastic")
    _joined = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined")

    def __init__(self) -> None:
        self.hits: dict[str, list[Line]] = {key: [] for key in RDZV}
        self.details: dict[str, Details] = {key: {} for key in RDZV}

    def feed(self, line: Line) -> None:
        text = line.text
        if self._in_use.search(text):
            self.hits["rdzv.port-in-use"].append(line)
            if (m := self._port.search(text)) and "port" not in self.details["rdzv.port-in-use"]:
                self.details["rdzv.port-in-use"]["port"] = _int(m.group(1) or m.group(2))
        elif self._unreachable.search(text):
            self.hits["rdzv.unreachable"].append(line)
            if (m := self._endpoint.search(text)) and "host" not in self.details["rdzv.unreachable"]:
                self.details["rdzv.unreachable"].update(host=(m.group(1) or m.group(3))[:120],
                                                        port=_int(m.group(2) or m.group(4)))
        elif self._timeout.search(text):
            self.hits["rdzv.timeout"].append(line)
            if m := self._joined.search(text):
                self.details["rdzv.timeout"].update(timeout_s=_int(m.group(1)), joined=_int(m.group(2)),
                                                    expected=_int(m.group(3)))

    def finish(self) -> list[Finding]:
        found = []
        for key, lines in self.hits.items():
            if lines:
                title, texts = RDZV[key]
                explanation, fixes = texts(self.details[key])
                found.append(Finding(key, title, "error", explanation, fixes, lines, len(lines), self.details[key]))
        return found


# ----------------------------------------------------------- 8. world size / rank mismatch

WORLD_FIXES = (
    "Start every node with the same torchrun arguments: --nnodes, --nproc-per-node, --rdzv-backend, --rdzv-endpoint "
    "and --rdzv-id (generate the command once and reuse it on every node).",
    "With a static rendezvous (--node-rank), give each node a distinct --node-rank from 0 to nnodes-1.",
    "Derive the world size in the training script from WORLD_SIZE / RANK set by torchrun, never from constants.",
    "After a failed run, stop every node's torchrun before relaunching: a leftover agent joins the new rendezvous or "
    "closes it.",
)


def _world_explanation(d: Details) -> str:
    parts = []
    if d.get("launch_mismatch"):
        parts.append(f"The nodes were launched with different settings ({d['launch_mismatch']}), so they do not "
                     "agree on how many nodes and processes the job has.")
    if d.get("invalid_rank"):
        parts.append(f"A worker asked NCCL for rank {d['invalid_rank']} (rank/world size), but ranks go from 0 to "
                     "world size - 1: its node computed a larger world than the others.")
    if d.get("duplicate_rank") is not None:
        parts.append(f"Rank {d['duplicate_rank']} of {d['world_size']} registered twice: two processes were given "
                     "the same rank (same --node-rank on two nodes, or the script overrides RANK).")
    if d.get("rendezvous_closed"):
        parts.append("A node tried to join a rendezvous the other nodes had already closed: it started late, was "
                     "restarted on its own, or belongs to a previous run.")
    return " ".join(parts)


class WorldSizeRule(Rule):
    """Nodes launched with different --nnodes / --nproc-per-node / endpoint, or a rank out of range."""

    keywords = ("launch configs", "min_nodes", "max_nodes", "nproc_per_node", "run_id", "rdzv_endpoint", "rdzv_backend",
                "Invalid rank requested", "already checked in", "RendezvousClosedError")
    _config_start = re.compile(r"Starting elastic_operator with launch configs")
    _config = re.compile(r"\b(min_nodes|max_nodes|nproc_per_node|run_id|rdzv_endpoint|rdzv_backend)\s+:\s*(\S+)\s*$")
    _invalid = re.compile(r"Invalid rank requested : (\d+)/(\d+)")
    _twice = re.compile(r"rank (\d+) of (\d+) ranks has already checked in")
    _closed = re.compile(r"RendezvousClosedError")
    _compared = ("min_nodes", "max_nodes", "nproc_per_node", "rdzv_endpoint", "run_id", "rdzv_backend")

    def __init__(self) -> None:
        self.configs: dict[str, dict[str, tuple[str, Line]]] = {}
        self.block_start: dict[str, int] = {}  # file -> line number where its launch-config block began
        self.lines: list[Line] = []
        self.details: Details = {}

    def feed(self, line: Line) -> None:
        text = line.text
        if self._config_start.search(text):
            self.block_start[line.file] = line.number
        elif (m := self._config.search(text)) and 0 < line.number - self.block_start.get(line.file, -99) < 30:
            self.configs.setdefault(line.file, {})[m.group(1)] = (m.group(2)[:120], line)
        elif m := self._invalid.search(text):
            self.lines.append(line)
            self.details.setdefault("invalid_rank", f"{m.group(1)}/{m.group(2)}")
        elif m := self._twice.search(text):
            self.lines.append(line)
            self.details.setdefault("duplicate_rank", _int(m.group(1)))
            self.details.setdefault("world_size", _int(m.group(2)))
        elif self._closed.search(text):
            self.lines.append(line)
            self.details.setdefault("rendezvous_closed", "yes")

    def finish(self) -> list[Finding]:
        lines, differ = list(self.lines), []
        for key in self._compared:
            values = {cfg[key][0] for cfg in self.configs.values() if key in cfg}
            if len(values) > 1:
                differ.append(f"{key} {' vs '.join(sorted(values))}")
                lines += [cfg[key][1] for cfg in self.configs.values() if key in cfg]
        if not lines:
            return []
        d = dict(self.details)
        if differ:
            d["launch_mismatch"] = "; ".join(differ)[:240]
        lines.sort(key=lambda x: x.position)
        return [Finding("dist.world-size-mismatch", "Nodes disagree on the job's size or ranks", "error",
                        _world_explanation(d), list(WORLD_FIXES), lines, len(lines), d)]


# ------------------------------------------------------------------------ 9. NaN loss

_NONFINITE = r"[-+]?(?:nan|inf(?:inity)?)"
NAN_FIXES = (
    "Resume from the last checkpoint saved before the first non-finite step, not from a later one.",
    "Lower the learning rate or lengthen the warmup; enable gradient clipping (e.g. max norm 1.0).",
    "Train in bf16 rather than fp16; with fp16 use dynamic loss scaling.",
    "Check the data around that step for empty, truncated or garbage samples (all-padding sequences, a label-only "
    "batch, corrupt shards).",
)


class NanLossRule(Rule):
    keywords = ()  # see wants(): "loss" in any case
    _key = r"(?<![\w.])(?:[A-Za-z]+[_/ ])?loss['\"]?"  # loss, lm loss, train/loss, total_loss, val_loss
    _best = re.compile(r"(?i:best|min|lowest)\W*\w*\W*$")  # "best val loss: inf" is an initial value, not a failure
    _nan = re.compile(rf"(?i:{_key}\s*(?:[:=]|\bis\b)?\s*['\"]?\s*(?:tensor\(\s*)?({_NONFINITE})(?![\w])"
                      rf"|(?<![\w])(nan|inf)\s+loss\b)")
    _null = re.compile(r'"loss"\s*:\s*null')
    _flagged = re.compile(r'"nonfinite"\s*:\s*(?:true|\[[^\]]*"loss")')
    _finite = re.compile(rf"(?i:{_key}\s*[:=]?\s*['\"]?\s*([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(?![\w.]))")
    _step = re.compile(r"(?i:\b(?:global_step|step|iter(?:ation)?)['\"]?\s*[:= ]\s*(\d+))|\((\d+)/\d+\)")

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.kind: str | None = None
        self.first_step: int | None = None
        self.last_finite: float | None = None

    def wants(self, text: str) -> bool:
        return "loss" in text.lower() or "nonfinite" in text

    def feed(self, line: Line) -> None:
        text = line.text
        m = next((m for m in self._nan.finditer(text) if not self._best.search(text[max(0, m.start() - 16):m.start()])),
                 None)
        if m or (self._null.search(text) and self._flagged.search(text)):
            if not self.lines:
                value = (m.group(1) or m.group(2)).lower() if m else "nan"
                self.kind = "inf" if "inf" in value else "nan"
                step = self._step.search(text)
                self.first_step = _int(step.group(1) or step.group(2)) if step else None
            self.lines.append(line)
        elif not self.lines and (f := self._finite.search(text)):
            self.last_finite = float(f.group(1))

    def finish(self) -> list[Finding]:
        if not self.lines:
            return []
        d: Details = {"first_step": self.first_step, "kind": self.kind, "last_finite_loss": self.last_finite}
        what = "infinite" if self.kind == "inf" else "NaN (not a number)"
        text = f"The training loss became {what}"
        text += f" at step {self.first_step}" if self.first_step is not None else ""
        text += f", after {self.last_finite:g}" if self.last_finite is not None else ""
        text += (f" ({len(self.lines)} non-finite loss line(s)). The usual causes are a learning rate too high for "
                 "this point of training, fp16 overflow, or a bad batch; once NaN reaches the weights every later "
                 "step is NaN too, so the GPU time after it is wasted.")
        return [Finding("train.nan-loss", "Training loss became NaN or infinite", "error", text, list(NAN_FIXES),
                        self.lines, len(self.lines), d)]
