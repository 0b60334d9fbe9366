"""The data package's errors, built so they keep their type across DataLoader worker processes.

torch re-raises an error from a worker in the main process by calling its class with one
string: "Caught CorruptShardError in DataLoader worker process 1.\\nOriginal Traceback ...",
the worker's whole traceback (torch.utils.data ... ExceptionWrapper.reraise). A class whose
constructor does not take one string becomes a plain RuntimeError there, and `except
CorruptShardError` never fires. So every class here takes a single message as well as its
usual arguments; from torch's text it keeps the original one-line message, prefixed with the
worker it came from, recovers the fields it can (`name`, `url`, `why` of a shard error) and
keeps the worker's traceback in `worker_traceback`. Pickling goes through the same one-string
form (an exception pickles as its args plus its __dict__), so they also cross any other
process boundary whole.
"""

from __future__ import annotations

import re

from trainready.errors import TrainreadyError
from trainready.io import redact

_REPACK = ". Re-pack or re-upload the dataset"
_SHARD_MESSAGE = re.compile(r"shard (\S+) \((.*)\) (is .*?)\. Re-pack or re-upload the dataset")
_WORKER = re.compile(r"\ACaught \w+ (in DataLoader worker process \d+|.*?)\.\nOriginal (Traceback .*)\Z", re.S)


def worker_message(message: str, class_name: str) -> tuple[str, str | None]:
    """(the error's own message, the worker's traceback or None) from what torch passes when it
    re-raises a worker's error; a message that is not torch's comes back as it is."""
    found = _WORKER.match(message)
    if not found:
        return message, None
    where, trace = found.groups()
    lines = re.findall(rf"^(?:[\w.]+\.)?{re.escape(class_name)}: (.*)$", trace, re.M)
    own = lines[-1] if lines else trace.strip().splitlines()[-1]
    where = where.removeprefix("in ").replace("DataLoader worker process", "DataLoader worker")
    return f"{where}: {own}", trace


class ShardError(TrainreadyError):
    """A shard that cannot be used; names the shard and where it lives (`name`, `url`, `why`:
    None only if a message from elsewhere did not say)."""

    exit_code = 1

    def __init__(self, name: str, url: str | None = None, why: str | None = None):
        self.worker_traceback: str | None = None
        if url is None and why is None:  # one message: a worker's error re-raised by torch, or unpickling
            message, self.worker_traceback = worker_message(name, type(self).__name__)
            found = _SHARD_MESSAGE.search(message)
            self.name, self.url, self.why = found.groups() if found else (None, None, None)
            super().__init__(message)
            return
        self.name, self.url, self.why = name, redact(url or ""), why or ""
        super().__init__(f"shard {name} ({self.url}) {why}{_REPACK} "
                         f"(`trainready data pack`), or read it with on_corrupt='skip' to skip this shard.")


class CorruptShardError(ShardError):
    def __init__(self, name: str, url: str | None = None, why: str | None = None):
        if url is None and why is None:
            super().__init__(name)
        else:
            super().__init__(name, url, f"is corrupt: {why}")


class MissingShardError(ShardError):
    def __init__(self, name: str, url: str | None = None):
        if url is None:
            super().__init__(name)
        else:
            super().__init__(name, url, "is missing: index.json lists it but the object does not exist")


class CacheFullError(TrainreadyError):
    """The shard cache stayed full (other processes hold every shard) for longer than its timeout."""

    exit_code = 1

    def __init__(self, message: str):
        message, self.worker_traceback = worker_message(message, type(self).__name__)
        super().__init__(message)


# every error class this package raises: tests check that each survives a worker and pickling
ERRORS = (ShardError, CorruptShardError, MissingShardError, CacheFullError)
