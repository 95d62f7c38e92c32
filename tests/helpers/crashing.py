"""User method classes that end the process that builds them, as a crash in native code or the kernel's
out-of-memory killer would (the warm-worker tests)."""

from __future__ import annotations

import os
import signal
import sys

from pfl.methods.fedavg import FedAvg


class KilledMethod(FedAvg):
    name = "killed"

    def __init__(self) -> None:
        print("killed while building the method", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


class RaisingMethod(FedAvg):
    name = "raising"

    def __init__(self) -> None:
        raise RuntimeError("an unexpected failure inside a user's method")


class ExitingMethod(FedAvg):
    name = "exiting"

    def __init__(self) -> None:
        os._exit(0)  # ends the process at once, with status 0 and no answer
