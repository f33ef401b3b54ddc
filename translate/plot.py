"""Pictures: attention heatmaps (one map or a grid of heads) and training curves, with matplotlib.

Figures go to files (`savefig`) or, through `figure_to_array`, to TensorBoard image summaries.
`curves_figure` draws the scalars of one or several runs, read from their TensorBoard event files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import matplotlib
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from translate.decoding import max_source_pieces
from translate.errors import UserError
from translate.model import Transformer
from translate.textio import atomic_path, check_output_path
from translate.tokenizer import (
    BOS,
    EOS,
    Tokenizer,
)

AttentionKind = Literal["cross", "encoder", "decoder"]
AXES = {  # kind -> (x label, y label)
    "cross": ("source pieces", "output pieces"),
    "encoder": ("source pieces (keys)", "source pieces (queries)"),
    "decoder": ("decoder input pieces (keys)", "decoder input pieces (queries)"),
}


def _figure(**kwargs) -> Figure:
    """A figure drawn by Agg, outside pyplot: plotting changes no global state (no backend is
    chosen, no figure is registered), so importing or calling this module leaves matplotlib as
    the user set it."""
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _heatmaps(
    weights: np.ndarray,
    col_pieces: list[str],
    row_pieces: list[str],
    title: str,
    xlabel: str,
    ylabel: str,
    panel_titles: list[str],
    cell: float,
    fontsize: float,
):
    """weights (P, R, C): P heatmaps in a grid (at most 4 a row) on one colour scale, each `cell`
    inches a piece. The margins are computed from the labels' lengths: matplotlib's automatic
    layouts measure every label and would make each validation's images seconds slower."""
    P, R, C = weights.shape
    ncols = min(P, 4)
    nrows = math.ceil(P / ncols)
    shrink = min(1.0, MAX_HEATMAPS_INCHES / (cell * max(ncols * C, nrows * R, 1)))  # long sentences: smaller cells
    cell, fontsize = cell * shrink, max(1.0, fontsize * shrink)
    char = 0.6 * fontsize / 72  # inches per character, about
    left = char * max(map(len, row_pieces), default=1) + 0.45
    bottom = char * max(map(len, col_pieces), default=1) + 0.45
    top = (0.3 if title else 0.1) + (0.25 if panel_titles[0] else 0.0)
    right, wgap, hgap = 1.0, 0.15, 0.25 + bottom * (nrows > 1)
    panel_w, panel_h = max(1.8, cell * C), max(1.2, cell * R)
    width = left + ncols * panel_w + (ncols - 1) * wgap + right
    height = bottom + nrows * panel_h + (nrows - 1) * hgap + top
    fig = _figure(figsize=(width, height))
    axes = fig.subplots(
        nrows, ncols, squeeze=False,
        gridspec_kw=dict(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                         wspace=wgap / panel_w, hspace=hgap / panel_h),
    )  # fmt: skip
    vmax = max(float(weights.max()), 1e-6)
    image = None
    for p, ax in enumerate(axes.flat):
        if p >= P:
            ax.axis("off")
            continue
        image = ax.imshow(weights[p], cmap="viridis", aspect="auto", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_xticks(range(C), col_pieces, rotation=90, fontsize=fontsize)
        if p % ncols == 0:
            ax.set_yticks(range(R), row_pieces, fontsize=fontsize)
        else:
            ax.set_yticks([])
        ax.set_xlabel(xlabel if p + ncols >= P else "")
        ax.set_ylabel(ylabel if p % ncols == 0 else "")
        if panel_titles[p]:
            ax.set_title(panel_titles[p], fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.08 / height, va="top")
    cax = fig.add_axes([1 - 0.8 / width, bottom / height, 0.15 / width, 1 - (bottom + top) / height])
    fig.colorbar(image, cax=cax)
    return fig


MAX_HEATMAPS_INCHES = 40.0  # the cells of a figure of heatmaps, at most, each way (6,000 pixels at 150 dpi)


def attention_figure(
    weights: np.ndarray,
    src_pieces: list[str],
    tgt_pieces: list[str],
    title: str = "",
    xlabel: str = "source pieces",
    ylabel: str = "output pieces",
):
    """weights (T, S): row t is how piece t of the rows (tgt_pieces) attends over the columns."""
    return _heatmaps(weights[None], src_pieces, tgt_pieces, title, xlabel, ylabel, [""], cell=0.3, fontsize=8)


def heads_figure(
    weights: np.ndarray,
    col_pieces: list[str],
    row_pieces: list[str],
    title: str = "",
    xlabel: str = "source pieces",
    ylabel: str = "output pieces",
):
    """weights (H, R, C): one heatmap per head in a grid (at most 4 a row), one colour scale."""
    cell, fontsize = (0.16, 6) if max(weights.shape[1:]) <= 30 else (0.12, 5)  # inches, points per piece
    heads = [f"head {h}" for h in range(weights.shape[0])]
    return _heatmaps(weights, col_pieces, row_pieces, title, xlabel, ylabel, heads, cell, fontsize)


def figure_to_array(fig) -> np.ndarray:
    """(H, W, 3) uint8 RGB, for SummaryWriter.add_image(..., dataformats='HWC')."""
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


@torch.inference_mode()
def attention_maps(
    model: Transformer,
    tokenizer: Tokenizer,
    source: str,
    target_ids: list[int],
    kind: AttentionKind = "cross",
    layer: int = -1,
) -> tuple[np.ndarray, list[str], list[str]]:
    """Every head's attention in one layer for one sentence pair: weights (H, R, C), the column
    pieces and the row pieces (rows attend over columns).

    cross: rows are the output pieces (target_ids + </s>), columns the source pieces (+ </s>);
    encoder: source over source; decoder: decoder input (<s> + target_ids) over itself.
    `target_ids` are the output's piece ids without BOS/EOS.
    """
    device = next(model.parameters()).device
    src_ids = tokenizer.encode([source])[0][: max_source_pieces([model])] + [EOS]
    src = torch.tensor([src_ids], device=device)
    tgt_in = torch.tensor([[BOS, *target_ids]], device=device)
    weights = model.attention(src, tgt_in)[kind][layer][0]  # (H, R, C)
    src_pieces = [tokenizer.id_to_piece(i) for i in src_ids]
    out_pieces = [tokenizer.id_to_piece(i) for i in target_ids]
    if kind == "cross":  # row t of tgt_in predicts piece t of the output (target_ids + EOS)
        cols, rows = src_pieces, out_pieces + ["</s>"]
    elif kind == "encoder":
        cols = rows = src_pieces
    else:
        cols = rows = ["<s>"] + out_pieces
    return weights.float().cpu().numpy(), cols, rows


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
    weights, src_pieces, tgt_pieces = attention_maps(model, tokenizer, source, target_ids, "cross", layer)
    return (weights.mean(0) if head is None else weights[head]), src_pieces, tgt_pieces


def sample_indices(
    tokenizer: Tokenizer, sources: Sequence[str], k: int = 3, min_pieces: int = 6, max_pieces: int = 30
) -> list[int]:
    """Up to k fixed sentences worth plotting: the first ones of min_pieces..max_pieces pieces
    (readable heatmaps), else the first ones that are not blank."""
    candidates = [i for i, s in enumerate(sources[:1000]) if s.strip()]
    lengths = tokenizer.encode([sources[i] for i in candidates]) if candidates else []
    fitting = [i for i, ids in zip(candidates, lengths) if min_pieces <= len(ids) <= max_pieces]
    return (fitting + [i for i in candidates if i not in fitting])[:k]


# ---------------------------------------------------------------------------- training curves


def event_dir(run: str | Path) -> Path:
    """The TensorBoard directory of a run: RUN_DIR/NAME/tb, or the given directory itself."""
    run = Path(run)
    if not run.is_dir():
        raise UserError(
            f"{run} is not a directory (give a run directory, RUN_DIR/NAME)"
            if run.exists()
            else f"run directory not found: {run}"
        )
    path = run / "tb" if (run / "tb").is_dir() else run
    if not any(path.glob("events.out.tfevents.*")):
        raise UserError(f"no TensorBoard event files in {path} (expected RUN_DIR/NAME/tb/events.out.tfevents.*)")
    return path


def read_scalars(run: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every scalar of a run's event files: tag -> (steps, values), in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(event_dir(run)), size_guidance={"scalars": 0}).Reload()
    scalars = {}
    for tag in events.Tags()["scalars"]:
        points = sorted((e.step, e.value) for e in events.Scalars(tag))
        scalars[tag] = (np.array([s for s, _ in points]), np.array([v for _, v in points]))
    return scalars


PANELS = [  # (title, [(tag, line style, legend)], y label)
    ("loss", [("train/loss", "-", "train"), ("valid/loss", "--", "valid")], "label-smoothed cross-entropy"),
    ("validation BLEU", [("valid/bleu", "-", "BLEU")], "BLEU"),
    ("learning rate", [("train/lr", "-", "lr")], "lr"),
]


def curves_figure(runs: Sequence[str | Path], labels: Sequence[str] | None = None):
    """Loss (train and valid), validation BLEU and learning rate against the step, one colour a run."""
    if not runs:
        raise UserError("give at least one run directory")
    data = [read_scalars(run) for run in runs]
    if labels is None:
        dirs = [event_dir(run).resolve() for run in runs]
        names = [(d.parent if d.name == "tb" else d).name for d in dirs]  # RUN/tb is RUN's curves
        labels = [n if names.count(n) == 1 else str(run) for n, run in zip(names, runs)]
    colours = matplotlib.colormaps["tab10"].colors
    fig = _figure(figsize=(5.0 * len(PANELS), 3.8), constrained_layout=True)
    axes = fig.subplots(1, len(PANELS))
    for ax, (title, series, ylabel) in zip(axes, PANELS):
        drawn = False
        for r, (scalars, label) in enumerate(zip(data, labels)):
            for tag, style, what in series:
                if tag not in scalars:
                    continue
                steps, values = scalars[tag]
                marker = "o" if tag.startswith("valid/") and len(steps) <= 30 else None
                name = label if len(series) == 1 else f"{label} ({what})"
                ax.plot(steps, values, style, color=colours[r % 10], marker=marker, markersize=3, label=name)
                drawn = True
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if title == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
        if drawn and (len(runs) > 1 or len(series) > 1):
            ax.legend(fontsize=8)
        if not drawn:
            ax.text(0.5, 0.5, "not logged yet", ha="center", va="center", transform=ax.transAxes, color="grey")
    return fig


def save_figure(fig, output: str | Path, dpi: int = 150) -> None:
    """Save as PNG (or any format matplotlib knows from the suffix: pdf, svg ...)."""
    given = Path(output)  # its name says the format, even where it is a link to another name
    output = check_output_path(given, "--output")
    kind = given.suffix.lstrip(".").lower()
    if kind not in fig.canvas.get_supported_filetypes():
        known = ", ".join(sorted(fig.canvas.get_supported_filetypes()))
        raise UserError(f"{given}: the file name must end in a picture format such as .png ({known})")
    with atomic_path(output, suffix=f".tmp{given.suffix}") as tmp:  # a picture that was there stays whole if this fails
        fig.savefig(tmp, dpi=dpi, format=kind)


def plot_curves(runs: Sequence[str | Path], output: str | Path) -> None:
    """`translate plot`: the training curves of one or several runs, saved at `output`."""
    save_figure(curves_figure(runs), output)
