"""A plain PyTorch reference trainer: `torch.nn.Transformer` with the same shape, batch and optimizer.

It is what a user would write in an afternoon: nn.Transformer (post-norm, ReLU, dropout),
scaled tied embeddings with sinusoidal positions, full logits, `F.cross_entropy` with label
smoothing, Adam, gradient clipping. `scripts/bench_train.py --vs-reference` times it against
translate's own training step on the same batches.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from translate.config import Config
from translate.data import Batch
from translate.hardware import by_precision
from translate.model import sinusoidal_positions
from translate.tokenizer import PAD


class ReferenceModel(nn.Module):
    def __init__(self, cfg: Config, vocab_size: int) -> None:
        super().__init__()
        m = cfg.model
        self.d_model = m.d_model
        self.embed = nn.Embedding(vocab_size, m.d_model, padding_idx=PAD)
        self.register_buffer("pe", sinusoidal_positions(m.max_positions, m.d_model), persistent=False)
        self.transformer = nn.Transformer(
            d_model=m.d_model,
            nhead=m.n_heads,
            num_encoder_layers=m.encoder_layers,
            num_decoder_layers=m.decoder_layers,
            dim_feedforward=m.d_ff,
            dropout=m.dropout,
            batch_first=True,
        )
        self.output = nn.Linear(m.d_model, vocab_size, bias=False)
        self.output.weight = self.embed.weight
        self.dropout = nn.Dropout(m.dropout)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(tokens) * math.sqrt(self.d_model) + self.pe[: tokens.size(1)])

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        T = tgt_in.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=src.device).triu(1)  # True = masked
        h = self.transformer(
            self.embed_tokens(src),
            self.embed_tokens(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src == PAD,
            tgt_key_padding_mask=tgt_in == PAD,
            memory_key_padding_mask=src == PAD,
            tgt_is_causal=True,
        )
        return self.output(h)


class ReferenceTrainer:
    def __init__(self, cfg: Config, vocab_size: int) -> None:
        t = cfg.train
        self.cfg = cfg
        self.model = ReferenceModel(cfg, vocab_size)
        self.model.train()
        lr = by_precision(t.lr, None)[0]  # it trains in fp32
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr, betas=tuple(t.adam_betas), eps=t.adam_eps)

    def step(self, batch: Batch) -> float:
        logits = self.model(batch.src, batch.tgt_in)
        loss = F.cross_entropy(
            logits.view(-1, logits.size(-1)),
            batch.tgt_out.view(-1),
            ignore_index=PAD,
            label_smoothing=self.cfg.train.label_smoothing,
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()
