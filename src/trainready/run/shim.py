"""What torchrun starts in each worker under `trainready run`: it replaces itself (exec, same pid)
with the user's command from TRAINREADY_COMMAND.

Why: torchrun parses its whole command line with argparse, which rejects a training script's own
arguments when they abbreviate one of torchrun's options (`--d 64` is "ambiguous: --dir? --dynamo?").
Passing the command through the environment keeps torchrun's argv free of them.
First, the worker is set to die with torchrun's agent (trainready.parent_death says why).
Standard library only (and that module): it runs before anything else in the worker.
Not parse_json: the command is our own environment variable, written by the launcher."""

import json
import os
import sys

from trainready.parent_death import die_with_parent


def main() -> None:
    die_with_parent()
    # torchrun's agent runs under our private umask so that the per-rank logs it creates are ours alone; the
    # training script gets the user's own umask back (its checkpoints, caches and outputs are the user's choice)
    user_umask = os.environ.pop("TRAINREADY_USER_UMASK", "")
    if user_umask.isdigit():
        os.umask(int(user_umask, 8) & 0o777)
    command = json.loads(os.environ.pop("TRAINREADY_COMMAND"))
    if os.path.basename(command[0]) in ("python", "python3") or command[0] == sys.executable:
        command = [sys.executable, "-u", *command[1:]]  # the launcher's interpreter, unbuffered like torchrun's
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
