import pytest
import torch

from translate.loss import label_smoothed_nll_loss


def test_epsilon_zero_is_nll():
    torch.manual_seed(0)
    logits, target = torch.randn(5, 7, 11), torch.randint(1, 11, (5, 7))
    loss, nll, n = label_smoothed_nll_loss(logits, target, 0.0, ignore_index=None)
    expected = torch.nn.functional.cross_entropy(logits.view(-1, 11), target.view(-1), reduction="sum")
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, expected)
    assert n == 35


def test_matches_torch_label_smoothing():
    torch.manual_seed(1)
    logits, target = torch.randn(20, 13), torch.randint(0, 13, (20,))
    loss, _, n = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=0)
    expected = torch.nn.functional.cross_entropy(logits, target, ignore_index=0, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, expected)
    assert n == (target != 0).sum()


def test_padding_does_not_change_the_loss():
    torch.manual_seed(2)
    logits, target = torch.randn(2, 4, 9), torch.randint(1, 9, (2, 4))
    padded_logits = torch.cat([logits, torch.randn(2, 3, 9)], dim=1)
    padded_target = torch.cat([target, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    a = label_smoothed_nll_loss(logits, target, 0.1)
    b = label_smoothed_nll_loss(padded_logits, padded_target, 0.1)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)


def test_smoothing_prefers_less_confident_predictions():
    target = torch.tensor([3])
    sharp = torch.full((1, 10), -30.0)
    sharp[0, 3] = 30.0
    soft = torch.zeros(1, 10)
    soft[0, 3] = 5.0
    assert label_smoothed_nll_loss(sharp, target, 0.0)[0] < label_smoothed_nll_loss(soft, target, 0.0)[0]
    assert label_smoothed_nll_loss(sharp, target, 0.2)[0] > label_smoothed_nll_loss(soft, target, 0.2)[0]


def reference_loss(logits, target, epsilon, ignore_index=0):
    """The loss written with autograd's own ops, to check the hand-written backward against."""
    lprobs = torch.log_softmax(logits, dim=-1)
    keep = target != ignore_index
    nll = -lprobs.gather(-1, target[..., None]).squeeze(-1) * keep
    smooth = -lprobs.mean(-1) * keep
    return (1 - epsilon) * nll.sum() + epsilon * smooth.sum()


def test_hand_written_backward_equals_autograd():
    torch.manual_seed(3)
    logits = torch.randn(3, 6, 17, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 17, (3, 6))
    target[0, :2] = 0  # padding
    for epsilon in (0.0, 0.1, 0.5):
        ours = torch.autograd.grad(label_smoothed_nll_loss(logits, target, epsilon)[0] * 0.7, logits)[0]
        expected = torch.autograd.grad(reference_loss(logits, target, epsilon) * 0.7, logits)[0]
        torch.testing.assert_close(ours, expected)
        assert ours[0, :2].abs().max() == 0  # padding gets no gradient


def test_a_second_backward_is_refused_not_wrong():
    """The backward turns the saved softmax into the gradient in place: a second one must fail loudly."""
    logits = torch.randn(4, 5, requires_grad=True)
    loss = label_smoothed_nll_loss(logits, torch.tensor([1, 2, 3, 4]), 0.1)[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
