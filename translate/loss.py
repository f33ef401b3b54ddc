"""Label-smoothed cross entropy as a pure function: sums and a token count, no averaging."""

from __future__ import annotations

import torch


def label_smoothed_nll_loss(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int | None = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits (..., V), target (...) -> (smoothed loss sum, NLL sum, number of counted tokens).

    The smoothed target puts 1 - epsilon on the reference token and spreads epsilon evenly
    over the whole vocabulary: loss = (1 - eps) * nll + eps * mean_v(-log p_v).
    Positions whose target is `ignore_index` (padding) count for nothing. The caller
    normalises (e.g. divides by the token count of the whole update).
    """
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (..., V)
    target = target.reshape(lprobs.shape[:-1])
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (...)
    if ignore_index is not None:
        keep = target != ignore_index
        nll = nll * keep
        ntokens = keep.sum()
    else:
        keep = None
        ntokens = torch.tensor(target.numel(), device=target.device)
    nll_sum = nll.sum()
    if epsilon == 0.0:
        return nll_sum, nll_sum.detach(), ntokens
    smooth = -lprobs.mean(dim=-1)  # (...)
    if keep is not None:
        smooth = smooth * keep
    loss = (1.0 - epsilon) * nll_sum + epsilon * smooth.sum()
    return loss, nll_sum.detach(), ntokens
