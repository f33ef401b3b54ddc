"""Attention heatmaps: a matplotlib figure for files, an image array for TensorBoard."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from translate.model import BOS, EOS, Transformer  # noqa: E402
from translate.tokenizer import Tokenizer  # noqa: E402


def attention_figure(weights: np.ndarray, src_pieces: list[str], tgt_pieces: list[str], title: str = ""):
    """weights (T, S): row t is how output piece t attends over the source pieces."""
    T, S = weights.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * S + 2), max(3.0, 0.35 * T + 1.5)))
    im = ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0.0, vmax=max(float(weights.max()), 1e-6))
    ax.set_xticks(range(S))
    ax.set_xticklabels(src_pieces, rotation=90, fontsize=8)
    ax.set_yticks(range(T))
    ax.set_yticklabels(tgt_pieces, fontsize=8)
    ax.set_xlabel("source pieces")
    ax.set_ylabel("output pieces")
    if title:
        ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig


def figure_to_array(fig) -> np.ndarray:
    """(H, W, 3) uint8 RGB, for SummaryWriter.add_image(..., dataformats='HWC')."""
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image


@torch.inference_mode()
def cross_attention(
    model: Transformer,
    tokenizer: Tokenizer,
    source: str,
    target_ids: list[int],
    layer: int = -1,
    head: int | None = None,
) -> tuple[np.ndarray, list[str], list[str]]:
    """Cross-attention of one sentence pair: weights (T, S), source pieces, output pieces.

    `target_ids` are the output's piece ids (without BOS/EOS); head None averages the heads.
    """
    device = next(model.parameters()).device
    src_ids = tokenizer.encode([source])[0][: model.cfg.max_positions - 1] + [EOS]
    src = torch.tensor([src_ids], device=device)
    tgt_in = torch.tensor([[BOS, *target_ids]], device=device)
    weights = model.attention(src, tgt_in)["cross"][layer][0]  # (H, T, S)
    weights = weights.mean(0) if head is None else weights[head]
    src_pieces = [tokenizer.id_to_piece(i) for i in src_ids]
    tgt_pieces = [tokenizer.id_to_piece(i) for i in target_ids] + ["</s>"]
    # row t of tgt_in predicts piece t of the output (target_ids + EOS)
    return weights.float().cpu().numpy(), src_pieces, tgt_pieces
