"""What a training run keeps track of, each in a type of its own: the state saved in checkpoints
(`TrainState`), the clocks of a session (`Clock`), the running sums of the updates between two
log lines (`Speedometer`), what one update returns (`UpdateResult`), and what decides when to
stop (`StopRequest` for signals, `stop_reason`'s named checks).

An update leaves its sums on the device (loss, gradient norm, whether it was skipped): nothing
here reads a device value but `Speedometer.read` (when the loop logs) and `Speedometer.window` and
`skipped_so_far` (when it saves), so the host never waits for the device in between.
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, fields

import torch

from translate.config import TrainConfig


@dataclass
class TrainState:
    """Counters saved in every checkpoint (as "progress"); `position` is the next global batch of `epoch`.

    `step` counts the updates made; an update whose loss or gradient was not finite counts too,
    but changes neither the weights nor the optimizer's moments (`skipped` counts those)."""

    step: int = 0
    epoch: int = 0
    position: int = 0
    epoch_batches: int | None = None  # the global batches `epoch` was packed into (None: not known)
    best: float | None = None
    best_step: int = 0
    bad_evals: int = 0
    skipped: int = 0
    elapsed: float = 0.0  # seconds of training (updates, validation, checkpoints) over every session
    window: dict | None = None  # Speedometer's sums since the last log line: a resumed run logs as one never stopped


@dataclass
class Clock:
    """Seconds this session spent on each part of the work."""

    setup: float = 0.0
    updates: float = 0.0
    validation: float = 0.0
    checkpoints: float = 0.0

    def summary(self, total: float) -> str:
        """How `total` seconds were spent, in one line."""
        parts = [f"{f.name.replace('setup', 'set-up')} {getattr(self, f.name) / 60:.1f} min" for f in fields(self)]
        parts = [f"{p} ({getattr(self, f.name) / max(total, 1e-9):.0%})" for p, f in zip(parts, fields(self))]
        other = total - sum(getattr(self, f.name) for f in fields(self))
        return f"time: {total / 60:.1f} min in all: " + ", ".join(parts) + f", other {other / 60:.1f} min"


@dataclass
class UpdateResult:
    """One update, as the device left it: sums over this rank's batches, and the flags agreed by every rank."""

    loss: torch.Tensor  # label-smoothed loss summed over this rank's target tokens
    nll: torch.Tensor  # NLL summed likewise
    grad_norm: torch.Tensor  # before clipping
    skipped: torch.Tensor  # bool: not finite, so the weights were left as they were
    ntokens: int  # this rank's target tokens
    all_ntokens: int  # every rank's
    stop: bool  # a rank was asked to stop (SIGINT/SIGTERM)
    out_of_time: bool  # train.max_time is spent (rank 0's clock)


@dataclass
class WindowStats:
    """The updates since the last log line, read from the device."""

    loss: float  # per target token, over the updates not skipped
    nll: float
    grad_norm: float  # mean over the updates not skipped
    tokens_per_s: float  # every rank's target tokens per second of updates
    updates: int
    skipped: int  # skipped in the window

    @property
    def ppl(self) -> float:
        return math.exp(min(self.nll, 50))


class Speedometer:
    """Running sums of the updates since the last `read`, and the skipped updates of the run, kept on
    the device: adding an update makes no synchronisation."""

    def __init__(self, device: torch.device, skipped_before: int = 0, window: dict | None = None) -> None:
        w = window or {"sums": [0.0] * 5, "skipped": 0, "in_row": 0, "all_ntokens": 0, "updates": 0, "seconds": 0.0}
        self.sums = torch.tensor(w["sums"], dtype=torch.float64, device=device)  # loss, nll, tokens, grad norm, updates
        self.skipped = torch.tensor([skipped_before, w["in_row"]], device=device)  # in all, in a row at the end
        self.skipped_in_window = torch.tensor(w["skipped"], dtype=torch.int64, device=device)
        self.all_ntokens, self.updates, self.seconds = w["all_ntokens"], w["updates"], w["seconds"]

    def window(self) -> dict:
        """The sums since the last `read`, as host values (a synchronisation), to go on from (`window=`)."""
        return {
            "sums": self.sums.tolist(),
            "skipped": int(self.skipped_in_window),
            "in_row": int(self.skipped[1]),
            "all_ntokens": self.all_ntokens,
            "updates": self.updates,
            "seconds": self.seconds,
        }

    def add(self, r: UpdateResult, seconds: float) -> None:
        """Sums of the updates not skipped (a skipped update's NaN stays out of them)."""
        ok = (~r.skipped).double()
        values = torch.stack([r.loss.double(), r.nll.double(), ok * r.ntokens, r.grad_norm.double(), ok])
        self.sums += torch.where(r.skipped, 0.0, values)
        bad = r.skipped.long()
        self.skipped_in_window += bad
        self.skipped[0] += bad
        self.skipped[1] = (self.skipped[1] + 1) * bad
        self.all_ntokens += r.all_ntokens
        self.updates += 1
        self.seconds += seconds

    def skipped_so_far(self) -> tuple[int, int]:
        """(updates skipped in the run, skipped at its end one after the other): a synchronisation."""
        total, in_row = self.skipped.tolist()
        return total, in_row

    def read(self) -> WindowStats:
        """The window's figures, then a new window. Reading waits for the device: the wait counts as
        the updates' time, since it is the work they queued."""
        start = time.perf_counter()
        loss, nll, ntokens, grad_norm, good = self.sums.tolist()
        skipped = int(self.skipped_in_window)
        self.seconds += time.perf_counter() - start
        if good:
            loss, nll, grad_norm = loss / max(ntokens, 1), nll / max(ntokens, 1), grad_norm / good
        else:  # every update of the window skipped: no figures, rather than zeros that read as a perfect model
            loss = nll = grad_norm = math.nan
        stats = WindowStats(
            loss=loss,
            nll=nll,
            grad_norm=grad_norm,
            tokens_per_s=self.all_ntokens / max(self.seconds, 1e-9),
            updates=self.updates,
            skipped=skipped,
        )
        self.sums.zero_()
        self.skipped_in_window.zero_()
        self.all_ntokens, self.updates, self.seconds = 0, 0, 0.0
        return stats


def stop_reason(t: TrainConfig, state: TrainState, update: UpdateResult, trained_s: float, last: bool) -> str | None:
    """Why training stops after this update, if it does: the named checks in order (`last`: the
    last update of train.max_epochs)."""
    if update.stop:
        return "signal"
    if state.step >= t.max_steps:
        return f"reached train.max_steps={t.max_steps}"
    if update.out_of_time:
        return f"reached train.max_time={t.max_time} ({trained_s / 60:.1f} min trained)"
    if last:
        return f"reached train.max_epochs={t.max_epochs}"
    if t.patience and state.bad_evals >= t.patience:
        return f"no better valid {t.best_metric} in {t.patience} evaluations (train.patience)"
    return None


class StopRequest:
    """SIGINT/SIGTERM ask the loop to finish its update, save and exit; a second SIGINT (Ctrl-C)
    stops at once, a second SIGTERM changes nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def handle(self, signum, frame) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT:  # a second Ctrl-C: stop now
                raise KeyboardInterrupt
            return  # SIGTERM again (a job's kill reaches every process, and torchrun sends its own): saving wins
        self.signum = signum

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        if self.signum is not None:  # stopping: a later SIGTERM must not cut the exit short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
