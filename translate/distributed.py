"""Set-up of the processes of a torchrun training: which process this is, the wait for rank 0's
data preparation (bounded), the process group (with the same bound on collectives), and a
watchdog that stops a worker whose launcher died.

torchrun starts each worker in a session of its own, so a launcher killed with SIGKILL (or by
the out-of-memory killer) would leave its workers training unsupervised and holding the run's
lock. The watchdog notices the new parent within a second and sends the worker SIGTERM, which the
training loop handles as it does any SIGTERM: the workers agree to stop inside an update, write a
checkpoint and exit, so `--resume` continues at once and exactly; a worker still there after
`GRACE_S` (e.g. stuck in a collective whose peer is gone) exits at once.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger("translate")

GRACE_S = 60.0  # after the SIGTERM, how long a worker whose launcher died may take to save and exit


@dataclass(frozen=True)
class World:
    """Where this process stands in the training: torchrun's RANK, WORLD_SIZE and LOCAL_RANK."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> World:
        env = os.environ
        return cls(int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0")))

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def watch_launcher(interval: float = 1.0, grace: float = GRACE_S) -> threading.Thread:
    """Start a daemon thread that sends this process SIGTERM once its parent (the launcher) is
    gone, then ends the process if it is still there `grace` seconds later."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        log.warning(f"the launcher (pid {parent}) is gone: stopping after this update")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        log.error(f"still running {grace:g} s after the launcher died: exiting")
        os._exit(1)

    thread = threading.Thread(target=watch, name="translate-launcher-watchdog", daemon=True)
    thread.start()
    return thread


def init_process_group(device: torch.device, timeout: float) -> None:
    """NCCL between GPUs, gloo between CPU processes; collectives fail after `timeout` seconds."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
