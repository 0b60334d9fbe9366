"""Rules for NCCL and its network transport: watchdog timeouts, EFA vs socket fallback,
unhandled system errors (see log_rules_base.py for the machinery)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .log_rules_base import Detail, Details, Finding, Line, Rule, _after, _gib, _int, _plural, _rank_list, _rank_of  # noqa: F401

# ---------------------------------------------------------------- 1. NCCL watchdog timeout

@dataclass
class _Timeout:
    rank: int | None
    seq: int | None
    op: str | None
    timeout_ms: int | None


WATCHDOG_FIXES = (
    "Record what every rank was doing: set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and TORCH_NCCL_DUMP_ON_TIMEOUT=1 so "
    "each rank dumps its flight-recorder trace on timeout (TORCH_NCCL_DEBUG_INFO_TEMP_FILE, default "
    "/tmp/nccl_trace_rank_<n>); `torchfrtrace <dump dir>` compares them and names the rank that is behind.",
    "Rerun with NCCL_DEBUG=INFO to see whether the network path is healthy, and run `trainready check` on each node.",
    "Raise the timeout (init_process_group(timeout=timedelta(minutes=30))) only when a step legitimately takes that "
    "long, e.g. rank 0 writing a checkpoint or evaluating while the others already wait at the next collective; "
    "better make that work asynchronous or run it on every rank.",
)


class WatchdogRule(Rule):
    keywords = ("Watchdog caught", "last enqueued", "anks ")
    _timeout = re.compile(r"Watchdog caught collective operation timeout")
    _seq = re.compile(r"SeqNum=(\d+)")
    _op = re.compile(r"OpType=(\w+)")
    _limit = re.compile(r"Timeout\(ms\)=(\d+)")
    _enqueued = re.compile(r"last enqueued (?:NCCL )?work: (\d+)")
    _group = re.compile(r"\[PG (?:ID )?(\d+)")
    _nranks = re.compile(r"\bn[Rr]anks (\d+)")

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.timeouts: list[_Timeout] = []
        self.enqueued: dict[int, int] = {}
        self.groups: set[str] = set()  # process groups named by the watchdog's follow-up lines
        self.world = 0

    def feed(self, line: Line) -> None:
        text = line.text
        if m := self._timeout.search(text):
            self.lines.append(line)
            tail = text[m.start():]  # the fields of this message, not of a prefix
            seq, op, limit = self._seq.search(tail), self._op.search(tail), self._limit.search(tail)
            self.timeouts.append(_Timeout(_rank_of(text), _int(seq.group(1)) if seq else None,
                                          op.group(1) if op else None, _int(limit.group(1)) if limit else None))
        elif m := self._enqueued.search(text):
            if group := self._group.search(text):
                self.groups.add(group.group(1))
            if (rank := _rank_of(text)) is not None:
                self.enqueued[rank] = min(_int(m.group(1)), self.enqueued.get(rank, _int(m.group(1))))
        elif m := self._nranks.search(text):
            self.world = max(self.world, _int(m.group(1)))

    def _behind(self, seq_by_rank: dict[int, int]) -> tuple[list[int], str]:
        """Which rank(s) the others wait for, and how we know."""
        if not seq_by_rank or len(self.groups) > 1:  # SeqNums of different process groups do not compare
            return [], ""
        top = max(seq_by_rank.values())
        never = sorted(r for r, last in self.enqueued.items() if last < top)
        if never:
            return never, f"never enqueued collective #{top} that the others time out in"
        if len(set(seq_by_rank.values())) > 1:
            low = min(seq_by_rank.values())
            return (sorted(r for r, s in seq_by_rank.items() if s == low),
                    f"timed out at SeqNum {low} while other ranks reached SeqNum {top}, so it issued fewer collectives")
        missing = sorted(set(range(self.world)) - set(seq_by_rank)) if self.world else []
        if missing and len(missing) < len(seq_by_rank):
            return missing, f"reported no timeout although the job has {self.world} ranks"
        return [], ""

    def finish(self) -> list[Finding]:
        if not self.timeouts:
            return []
        first = self.timeouts[0]
        seq_by_rank: dict[int, int] = {}
        for t in self.timeouts:
            if t.rank is not None and t.seq is not None:
                seq_by_rank[t.rank] = min(t.seq, seq_by_rank.get(t.rank, t.seq))
        behind, why = self._behind(seq_by_rank)
        seqs = [t.seq for t in self.timeouts if t.seq is not None]
        d: Details = {"rank": first.rank, "ranks": _rank_list(t.rank for t in self.timeouts if t.rank is not None) or None,
                      "collective": first.op, "seq": first.seq, "timeout_ms": first.timeout_ms,
                      "lagging_rank": _rank_list(behind) or None, "world_size": self.world or None}
        limit = f" {first.timeout_ms / 1000:g} s" if first.timeout_ms else ""
        span = f"{min(seqs)}-{max(seqs)}" if seqs and min(seqs) != max(seqs) else d["seq"]
        what = (first.op or "a collective") + (f" (SeqNum {span})" if span is not None else "")
        text = (f"{_plural(d['ranks'])} {d['ranks'] or '?'} waited{limit} in {what} and the NCCL watchdog aborted it. "
                "A collective completes only when every rank of the process group joins it, so at least one rank "
                "did not: it crashed, hung (dataloader, storage, a deadlock), was still busy with slow work (rank 0 "
                "saving a checkpoint or evaluating while the others wait), or called collectives in a different "
                "order (desync).")
        if behind:
            text += f" {_plural(d['lagging_rank'])} {d['lagging_rank']} {why}: that is where the others wait."
        elif len(set(seqs)) > 1:
            text += (" The ranks time out in different collectives, probably of different process groups: the "
                     "flight recorder (below) shows which rank is behind in which group.")
        else:
            text += (" Every rank that reported waits in the same collective: look for a rank missing from this "
                     "list; if none is missing, the collective itself stalled and the network is suspect.")
        first_fix = (f"Read the log of rank {d['lagging_rank']} first" if behind else
                     "Find the rank that is missing from the list above (or still running) and read its log first")
        first_fix += ": its last lines show what it was doing, and an earlier crash there is the real failure."
        return [Finding("nccl.watchdog-timeout", "NCCL collective timed out: a rank never joined it", "error",
                        text, [first_fix, *WATCHDOG_FIXES], self.lines, len(self.lines), d)]


# ------------------------------------------- 2 + 3. NCCL network transport (EFA / sockets)

SOCKET_FIXES = (
    "Install the EFA stack: use the AWS Deep Learning AMI or container, or run the EFA installer (EFA driver and "
    "libfabric) and install aws-ofi-nccl, the NCCL plugin that drives EFA.",
    "Make NCCL find the plugin: LD_LIBRARY_PATH must include /opt/amazon/ofi-nccl/lib (current installs) or "
    "/opt/aws-ofi-nccl/lib (older AMIs); with NCCL_DEBUG=INFO the log should then name provider efa and the "
    "network Libfabric or AWS Libfabric.",
    "Set FI_PROVIDER=efa in every worker's environment, and check `fi_info -p efa -t FI_EP_RDM` lists the EFA "
    "devices (containers need the /dev/infiniband devices passed through).",
    "The instances' security group must allow all inbound and outbound traffic to and from the security group "
    "itself: EFA needs that self-referencing rule, opening individual ports is not enough.",
    "Run `trainready check` on each node: it checks the EFA devices, libfabric and the plugin.",
)
OFI_FIXES = (
    "Check that libfabric sees EFA: `fi_info -p efa -t FI_EP_RDM` must list devices. If it does not, the EFA "
    "driver is missing (run the EFA installer), the instance was launched without EFA interfaces, or the "
    "container lacks the /dev/infiniband/uverbs* devices.",
    "Make the plugin loadable: LD_LIBRARY_PATH must include /opt/amazon/ofi-nccl/lib or /opt/aws-ofi-nccl/lib "
    "(or set NCCL_NET_PLUGIN to its path), and the plugin must be built for this NCCL and CUDA (see the "
    "aws-ofi-nccl release notes).",
    "Set FI_PROVIDER=efa, and FI_EFA_USE_DEVICE_RDMA=1 on p4d/p5 for GPUDirect RDMA (recent libfabric enables it "
    "by itself).",
    "Run `trainready check` on the node: it checks the EFA devices, libfabric and the plugin.",
)


@dataclass
class _NetFile:
    socket: list[Line] = field(default_factory=list)
    bad_provider: list[Line] = field(default_factory=list)
    ofi_failed: list[Line] = field(default_factory=list)
    plugin_missing: list[Line] = field(default_factory=list)
    healthy: bool = False
    via_socket: bool = False
    via_net: bool = False  # a channel crosses nodes ("via NET/...")
    via_local: bool = False  # a channel stays in the node ("via P2P/...", "via SHM/...")
    nnodes: set[int] = field(default_factory=set)


class NetworkRule(Rule):
    """Per file: did NCCL end up on TCP sockets, and did the EFA plugin (aws-ofi-nccl) fail?"""

    keywords = ("NET/", "etwork", "fi_getinfo", "libnccl-net", "OFI NCCL", "nNodes", "via P2P/", "via SHM/")
    _socket = re.compile(r"NET/Socket : Using \[\d+\]([\w.-]+)|Using network Socket|Using internal Network Socket"
                         r"|via NET/Socket")
    _healthy = re.compile(r"Using network (?!Socket\b)\w|via NET/(?!Socket)\w|NET/IB : Using \["
                          r"|NET/OFI Selected [Pp]rovider is efa")
    _bad_provider = re.compile(r"NET/OFI Selected [Pp]rovider is (tcp|sockets|udp)\b")
    _ofi_failed = re.compile(r"(?:NCCL WARN|\bWARN:).{0,200}NET/OFI|NET/OFI .{0,80}(?:Couldn't|Could not) find any "
                             r"optimal provider|OFI NCCL failure|fi_getinfo: provider efa output empty list")
    _plugin_missing = re.compile(r"libnccl-net\.so: cannot open shared object file|No plugin found \(libnccl-net\.so\)")
    _nnodes = re.compile(r"\bnNodes (\d+)")

    def __init__(self) -> None:
        self.files: dict[str, _NetFile] = {}
        self.fallback: list[Line] = []
        self.ofi: list[Line] = []
        self.ifaces: list[str] = []
        self.providers: list[str] = []
        self.fallback_files = 0
        self.plugin_only = True  # the EFA finding rests only on "plugin not found" lines

    def feed(self, line: Line) -> None:
        s = self.files.setdefault(line.file, _NetFile())
        text = line.text
        if m := self._bad_provider.search(text):
            s.bad_provider.append(line)
            self.providers.append(m.group(1))
        elif m := self._socket.search(text):
            s.socket.append(line)
            s.via_socket |= "via NET/Socket" in text
            if m.group(1):
                self.ifaces.append(m.group(1))
        elif self._healthy.search(text):
            s.healthy = True
        if self._ofi_failed.search(text):
            s.ofi_failed.append(line)
        elif self._plugin_missing.search(text):
            s.plugin_missing.append(line)
        if m := self._nnodes.search(text):
            s.nnodes.add(_int(m.group(1)))
        s.via_net |= "via NET/" in text
        s.via_local |= "via P2P/" in text or "via SHM/" in text

    def end_file(self, file: str) -> None:
        s = self.files.pop(file, None)
        if s is None:
            return
        # sockets cost nothing when no traffic leaves the node: NCCL says nNodes 1, or (older NCCL) every
        # channel it lists is intra-node
        single_node = (max(s.nnodes) == 1 and not s.via_socket) if s.nnodes else (s.via_local and not s.via_net)
        fell_back = bool(s.bad_provider) or (bool(s.socket) and not s.healthy and not single_node)
        if fell_back:
            self.fallback += s.bad_provider + s.socket
            self.fallback_files += 1
        if s.ofi_failed:
            self.ofi += s.ofi_failed
            self.plugin_only = False
        if s.plugin_missing and fell_back and not s.bad_provider:
            self.ofi += s.plugin_missing

    def finish(self) -> list[Finding]:
        for file in list(self.files):
            self.end_file(file)
        found = []
        if self.ofi:
            found.append(self._ofi_finding())
        if self.fallback:
            lines = sorted(self.fallback, key=lambda x: x.position)
            d: Details = {"interface": self.ifaces[0] if self.ifaces else None,
                          "provider": self.providers[0] if self.providers else None, "files": self.fallback_files}
            if d["provider"]:
                text = (f"aws-ofi-nccl loaded, but libfabric chose its {d['provider']} provider instead of efa, so "
                        "cross-node traffic runs over TCP: the EFA device is not visible to this process.")
            else:
                where = f" on {d['interface']}" if d["interface"] else ""
                text = (f"NCCL moves cross-node traffic over plain TCP sockets{where}: no EFA (libfabric, NET/OFI) or "
                        "InfiniBand transport was loaded.")
            text += (" On EFA instances (p4d, p5) that gives roughly a tenth of the collective bandwidth, so "
                     "multi-node steps are several times slower; the job runs, it just wastes GPU hours.")
            found.append(Finding("nccl.socket-fallback", "NCCL fell back to TCP sockets instead of EFA", "warning",
                                 text, list(SOCKET_FIXES), lines, len(lines), d))
        return found

    def _ofi_finding(self) -> Finding:
        lines = sorted(self.ofi, key=lambda x: x.position)
        reasons = [_after(x.text, "NET/OFI ", "<warn> ") for x in lines if self._ofi_failed.search(x.text)]
        d: Details = {"reason": reasons[0] if reasons else "libnccl-net.so (the NCCL network plugin) not found",
                      "fell_back_to_socket": "yes" if self.fallback else "no"}
        if self.plugin_only:
            text = ("NCCL could not load a network plugin (libnccl-net.so), so aws-ofi-nccl, which lets NCCL use "
                    "EFA, is not installed or not on LD_LIBRARY_PATH.")
        else:
            text = f"aws-ofi-nccl, the plugin through which NCCL uses EFA, failed: {d['reason']}."
            if any(k in str(d["reason"]) for k in ("empty list", "optimal provider", "fi_getinfo")):
                text += (" libfabric found no usable EFA provider: the EFA device is not visible (driver missing, "
                         "instance without EFA interfaces, or a container started without the EFA devices).")
        if self.fallback:
            text += " NCCL then fell back to TCP sockets (see nccl.socket-fallback)."
        return Finding("efa.ofi-init-failed", "The EFA plugin for NCCL (aws-ofi-nccl) is missing or failed",
                       "warning" if self.plugin_only else "error", text, list(OFI_FIXES), lines, len(lines), d)


# ------------------------------------------------------- 4. NCCL unhandled system error

_CONNECTION = re.compile(r"Connection refused|Connection closed|Connection reset|connection abort|socketStartConnect"
                         r"|Connect to|No route to host|timed out", re.IGNORECASE)


def _syserr_fixes(d: Details) -> list[str]:
    if d["shm"] == "yes":
        return ["Give the container a larger /dev/shm: `docker run --shm-size=16g` (or `--ipc=host`); on Kubernetes "
                "mount an emptyDir with medium: Memory at /dev/shm. Check with `df -h /dev/shm` inside the container.",
                "NCCL_SHM_DISABLE=1 avoids shared memory but moves intra-node traffic to slower paths: last resort."]
    fixes = ["Rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) to see which call failed."]
    if d["cause"] and _CONNECTION.search(str(d["cause"])):
        fixes = ["The peer NCCL could not reach has often died first: find the earliest error in the other ranks' "
                 "logs.",
                 "Pin NCCL to the interface the nodes reach each other on: NCCL_SOCKET_IFNAME=eth0 (ens5 / enp on "
                 "newer instances; never lo or docker0).",
                 "The security group must allow all traffic to and from itself; check host firewalls too."] + fixes
    return fixes + ["Run `trainready check` on each node."]


class NcclSystemErrorRule(Rule):
    keywords = ("system error", "ncclSystemError", "shared memory segment", "/dev/shm", "posix_fallocate", "NCCL WARN",
                "Last error:")
    _error = re.compile(r"unhandled system error|ncclSystemError")
    _shm = re.compile(r"Error while creating shared memory segment|failed to extend /dev/shm|posix_fallocate failed")
    _shm_size = re.compile(r"shared memory segment \S+ \(size (\d+)\)")
    _last_error = re.compile(r"Last error:\s*(\S.*)?$")
    _warn = re.compile(r"NCCL WARN \S")
    _label = re.compile(r"^\d+: ")  # srun -l

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.cause: Line | None = None
        self.last_warn: dict[str, Line] = {}
        self.shm_bytes: int | None = None

    def feed(self, line: Line) -> None:
        text = line.text
        if self.wants_next:  # the line after a bare "Last error:" names the cause
            self.wants_next = False
            self.cause = self.cause or (line if text.strip() else None)
        if self._shm.search(text):
            self.lines.append(line)
            self.cause = self.cause or line
            if m := self._shm_size.search(text):
                self.shm_bytes = _int(m.group(1))
        elif self._error.search(text):
            self.lines.append(line)
            warn = self.last_warn.get(line.file)
            if self.cause is None and warn is not None and line.number - warn.number < 500:
                self.cause = warn
        elif m := self._last_error.search(text):
            if m.group(1):
                self.cause = self.cause or line
            else:
                self.wants_next = True
        if self._warn.search(text):
            self.last_warn[line.file] = line

    def finish(self) -> list[Finding]:
        if not self.lines:
            return []
        cause = self._label.sub("", _after(self.cause.text, "NCCL WARN ", "Last error:")) if self.cause else None
        shm = any(self._shm.search(x.text) for x in self.lines) or "/dev/shm" in (cause or "")
        d: Details = {"cause": cause or None, "shm": "yes" if shm else "no",
                      "shm_segment_mib": round(self.shm_bytes / 2**20, 1) if self.shm_bytes else None}
        text = "An NCCL call failed in the operating system or a library it uses (ncclSystemError)."
        if cause:
            text += f" The error NCCL logged with it: \"{cause}\"."
        if shm:
            text += (" NCCL could not create its shared-memory segment in /dev/shm: containers get 64 MB there by "
                     "default, and NCCL needs several MB per pair of GPUs for its intra-node transport.")
        elif cause and _CONNECTION.search(cause):
            text += " A network connection between ranks failed: a peer was down, unreachable, or on the wrong interface."
        lines = sorted({*self.lines, *([self.cause] if self.cause else [])}, key=lambda x: x.position)
        return [Finding("nccl.unhandled-system-error", "NCCL failed on a system call (unhandled system error)", "error",
                        text, _syserr_fixes(d), lines, len(lines), d)]
