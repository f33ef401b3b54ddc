"""Validation during training: the valid split's loss and perplexity, and BLEU/chrF of its
translations (with a few samples and their attention sent to TensorBoard).

Every rank computes the loss on its share of the batches; rank 0 translates and scores, and the
scores are sent to every rank so that all take the same early-stopping decision."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist

from translate.batching import token_batches
from translate.config import Config
from translate.data import collate, load_split
from translate.engine import Engine, first_best
from translate.evaluate import score
from translate.hardware import Padding
from translate.loss import label_smoothed_nll_loss
from translate.model import Transformer
from translate.textio import read_all_lines
from translate.tokenizer import PAD, Tokenizer
from translate.trainlog import TensorboardLogger


class Validator:
    def __init__(
        self,
        cfg: Config,
        data_dir: Path,
        tokenizer: Tokenizer,
        device: torch.device,
        amp: torch.dtype | None,
        padding: Padding,
        max_tokens: int,
        rank: int,
        world: int,
    ) -> None:
        self.cfg, self.tokenizer, self.device, self.amp, self.rank, self.world = (
            cfg,
            tokenizer,
            device,
            amp,
            rank,
            world,
        )
        self.padding, self.max_tokens = padding, max_tokens  # the loss's batches are formed as training's
        self.data = load_split(data_dir, "valid")
        self.sources = read_all_lines(data_dir / f"valid.{cfg.data.src_lang}", "valid source")
        self.refs = read_all_lines(data_dir / f"valid.{cfg.data.tgt_lang}", "valid reference")

    @torch.no_grad()
    def __call__(self, model: Transformer, step: int, logger: TensorboardLogger) -> dict[str, float]:
        """loss, nll, ppl, bleu, chrf of `model` (left in training mode)."""
        model.eval()
        metrics = self.loss(model)
        scores = torch.zeros(2, dtype=torch.float64, device=self.device)
        if self.rank == 0:
            limit = self.cfg.train.eval_max_sentences or len(self.sources)
            hyps = self.translate(model, self.sources[:limit])
            s = score(hyps, self.refs[:limit])
            scores += torch.tensor([s["bleu"], s["chrf"]], dtype=torch.float64, device=self.device)
            logger.samples(step, model, self.tokenizer, self.sources, self.refs, hyps, self.cfg.model.max_positions)
        if self.world > 1:
            dist.broadcast(scores, 0)  # every rank takes the same early-stopping decision
        metrics["bleu"], metrics["chrf"] = scores.tolist()
        model.train()
        return metrics

    def loss(self, model: Transformer) -> dict[str, float]:
        """Label-smoothed loss, NLL and perplexity per target token, over every rank's batches."""
        lens = self.data.src_lens, self.data.tgt_lens
        batches = token_batches(*lens, self.max_tokens, shuffle=False, pad_to_multiple=self.padding.pack)
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        for idx in batches[self.rank :: self.world]:
            # shaped as training's batches (the projected positions too), so that it brings no new shapes
            batch = collate(self.data, idx, self.padding.pad, self.padding.project).to(self.device)
            with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
                logits = model(batch.src, batch.tgt_in, batch.keep)
            loss, nll, n = label_smoothed_nll_loss(logits, batch.target(), self.cfg.train.label_smoothing, PAD)
            sums += torch.stack([loss.double(), nll.double(), n.double()])
        if self.world > 1:
            dist.all_reduce(sums)
        loss, nll, n = sums.tolist()
        return {"loss": loss / n, "nll": nll / n, "ppl": math.exp(min(nll / n, 50))}

    def translate(self, model: Transformer, lines: list[str]) -> list[str]:
        d = self.cfg.decode
        engine = Engine.from_model(
            model,
            self.tokenizer,
            d.search_options(beam_size=self.cfg.train.eval_beam_size),
            batch_tokens=d.batch_tokens,
            device=self.device,
            protect=d.protect,
            workers=1,  # one batch at a time on every thread, as the published runs were validated
        )
        return first_best(engine.translate(lines))
