"""The optimizer and the learning-rate schedule of a run, and its seeding."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import torch

from translate.config import Config


def lr_lambda(cfg: Config, lr: float, time_spent: Callable[[], float] = lambda: 0.0):
    """Multiplier of the peak `lr` (train.lr at the run's precision) after `step` updates (LambdaLR);
    linear warmup for every schedule.

    `time_spent`: the share of train.max_time trained so far (the same on every rank), for
    train.cooldown: the schedule's factor falls linearly to 0 over the last `cooldown` of the run,
    whichever of max_steps and max_time ends it first."""
    t, shape = cfg.train, schedule_shape(cfg, lr)

    def factor(step: int) -> float:
        if not t.cooldown:
            return shape(step)
        spent = max(step / t.max_steps, time_spent())
        return shape(step) * min(1.0, max(1.0 - spent, 0.0) / t.cooldown)

    return factor


def schedule_shape(cfg: Config, lr: float) -> Callable[[int], float]:
    """train.schedule's multiplier of the peak `lr` after `step` updates, before any cooldown."""
    t, d = cfg.train, cfg.model.d_model
    warmup = max(t.warmup_steps, 1)

    def factor(step: int) -> float:
        s = step + 1  # the update about to be made
        if t.schedule == "noam":  # d^-0.5 * min(s^-0.5, s * w^-1.5), train.lr ignored
            return d**-0.5 * min(s**-0.5, s * warmup**-1.5) / lr
        if s < warmup:
            return s / warmup
        if t.schedule == "inverse_sqrt":
            return math.sqrt(warmup / s)
        progress = min((s - warmup) / max(t.max_steps - warmup, 1), 1.0)  # cosine
        floor = t.min_lr / lr
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_optimizer(cfg: Config, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """train.optimizer at the peak `lr` (train.lr at the run's precision)."""
    t = cfg.train
    cls = torch.optim.AdamW if t.optimizer == "adamw" else torch.optim.Adam
    # The fused kernel is several times faster than the per-tensor loop (7x for the default model on CPU).
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    return cls(
        model.parameters(), lr=lr, betas=tuple(t.adam_betas), eps=t.adam_eps, weight_decay=t.weight_decay, fused=fused
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
