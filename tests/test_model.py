import pytest
import torch

from tests.conftest import tiny_model
from translate.config import ModelConfig
from translate.model import MultiHeadAttention, Transformer, sinusoidal_positions
from translate.tokenizer import BOS, PAD


def tiny(norm="post", tie=True, dropout=0.0):
    return tiny_model(40, n_heads=4, init="normal", norm=norm, tie_embeddings=tie, dropout=dropout)


def test_sinusoidal_formula():
    pe = sinusoidal_positions(50, 16)
    pos, i = 7, 3
    assert pe[pos, 2 * i].item() == pytest.approx(torch.sin(torch.tensor(pos / 10000 ** (2 * i / 16))).item(), abs=1e-6)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(
        torch.cos(torch.tensor(pos / 10000 ** (2 * i / 16))).item(), abs=1e-6
    )


def test_positions_depend_on_position_not_batch_size():
    """The seed's pe[:x.size(0)] on batch-first input slices by batch size; ours must not."""
    model = tiny()
    tokens = torch.randint(4, 40, (1, 6))
    one = model.embed_tokens(model.embed, tokens)
    five = model.embed_tokens(model.embed, tokens.repeat(5, 1))
    for b in range(5):
        torch.testing.assert_close(five[b], one[0])
    # the same token at two positions gets different encodings
    same = torch.full((1, 3), 7)
    x = model.embed_tokens(model.embed, same)
    assert not torch.allclose(x[0, 0], x[0, 1])


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cached_decoding_equals_full_recomputation(norm):
    model = tiny(norm)
    src = torch.randint(4, 40, (3, 9))
    src[1, 6:] = PAD
    tgt = torch.randint(4, 40, (3, 7))
    tgt[:, 0] = BOS
    with torch.no_grad():
        full = model(src, tgt)
        memory, mask = model.encode(src)
        state = model.init_state(memory, mask)
        steps = torch.stack([model.decode_step(tgt[:, t], state) for t in range(tgt.size(1))], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_reorder_state_follows_rows():
    model = tiny()
    src = torch.randint(4, 40, (2, 5))
    tgt = torch.randint(4, 40, (2, 4))
    with torch.no_grad():
        memory, mask = model.encode(src)
        state = model.init_state(memory, mask)
        for t in range(3):
            model.decode_step(tgt[:, t], state)
        swapped = model.reorder_state(state, torch.tensor([1, 0, 1]))
        a = model.decode_step(tgt[[1, 0, 1], 3], swapped)
        b = model.decode_step(tgt[:, 3], state)
    torch.testing.assert_close(a, b[[1, 0, 1]])


def test_source_padding_does_not_change_outputs():
    model = tiny()
    src = torch.randint(4, 40, (1, 5))
    tgt = torch.randint(4, 40, (1, 4))
    padded = torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), model(padded, tgt), atol=1e-5, rtol=1e-5)


def test_future_is_masked():
    """Changing a later target token leaves earlier positions' outputs unchanged."""
    model = tiny()
    src = torch.randint(4, 40, (1, 5))
    tgt = torch.randint(4, 40, (1, 6))
    changed = tgt.clone()
    changed[0, 4] = (tgt[0, 4] + 1) % 40
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_attention_weights_path_matches_fast_path():
    attn = MultiHeadAttention(16, 4).eval()
    q, kv = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    fast, none = attn(q, kv, mask)
    slow, w = attn(q, kv, mask, need_weights=True)
    assert none is None
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 3))
    assert w[1, :, :, 3:].abs().max() == 0


def test_attention_maps_shapes_and_keep_mask():
    model = tiny()
    src, tgt = torch.randint(4, 40, (2, 5)), torch.randint(4, 40, (2, 3))
    with torch.no_grad():
        maps = model.attention(src, tgt)
        full = model(src, tgt)
        keep = torch.tensor([[True, False, True], [True, True, False]])
        kept = model(src, tgt, keep.view(-1).nonzero().squeeze(1))  # flat positions
    assert maps["cross"][0].shape == (2, 4, 3, 5) and maps["encoder"][1].shape == (2, 4, 5, 5)
    assert maps["decoder"][0].shape == (2, 4, 3, 3)
    torch.testing.assert_close(kept, full[keep])


def test_tied_embeddings_share_weights():
    tied, untied = tiny(tie=True), tiny(tie=False)
    assert tied.output.weight is tied.embed.weight and tied.tgt_embed is tied.embed
    assert untied.output.weight is not untied.embed.weight
    assert sum(p.numel() for p in tied.parameters()) < sum(p.numel() for p in untied.parameters())


def test_dropout_keeps_the_expectation_and_is_seeded():
    from translate.model import Dropout

    drop = Dropout(0.1).train()
    x = torch.ones(200_000, requires_grad=True)
    torch.manual_seed(3)
    y = drop(x)
    kept = (y > 0).float().mean().item()
    assert abs(kept - (1 - 26 / 256)) < 0.005  # p rounds to 26/256
    assert abs(y.mean().item() - 1.0) < 0.01
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # d(x * mask * scale)/dx = mask * scale
    torch.manual_seed(3)
    assert torch.equal(drop(x), y)
    assert torch.equal(drop.eval()(x), x) and torch.equal(Dropout(0.0).train()(x), x)
    high = Dropout(0.999).train()(torch.ones(50_000))  # the config allows p < 1: at most 255/256 dropped
    assert 0 < (high > 0).float().mean().item() < 0.01 and abs(high.mean().item() - 1.0) < 0.3


def test_initialisation_is_the_same_in_every_process():
    """The same seed gives the same weights in every process, for each `model.init` with tied and
    untied embeddings (a fresh process each: module hashes differ, the weights must not)."""
    import subprocess
    import sys

    code = (
        "import torch; from translate.config import ModelConfig; from translate.model import Transformer\n"
        "for init in ('normal', 'xavier'):\n"
        "    for tie in (True, False):\n"
        "        torch.manual_seed(0); m = Transformer(ModelConfig(d_model=64, d_ff=128, init=init, tie_embeddings=tie), 500)\n"
        "        print(init, tie, sum(float(p.double().sum()) * (i + 1) for i, p in enumerate(m.parameters())))"
    )
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert len(runs) == 1 and len(runs.pop().splitlines()) == 4


@pytest.mark.parametrize("init", ["normal", "xavier"])
@pytest.mark.parametrize("tie", [True, False])
def test_initialisation_follows_model_init(init, tie):
    """The PAD embedding is zero, biases are zero, and `normal` draws matrices and embeddings N(0, 0.02)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=64, d_ff=128, init=init, tie_embeddings=tie), 500)
    for emb in (model.embed, model.tgt_embed):
        assert emb.weight[PAD].abs().sum() == 0
    assert all(float(p.detach().abs().sum()) == 0 for n, p in model.named_parameters() if n.endswith(".bias"))
    w1 = model.encoder[0].ffn.linear1.weight.detach()
    if init == "normal":
        assert abs(float(w1.std()) - 0.02) < 0.002 and abs(float(model.embed.weight[4:].detach().std()) - 0.02) < 0.002
    else:
        bound = (6 / sum(w1.shape)) ** 0.5  # xavier-uniform
        assert float(w1.abs().max()) <= bound and abs(float(model.embed.weight[4:].detach().std()) - 64**-0.5) < 0.01
