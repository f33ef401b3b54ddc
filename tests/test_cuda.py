"""CUDA paths: mixed precision training (bf16, fp16 with the gradient scaler), the precision
chosen by `auto`, updates without synchronisation, the additive padding mask, half-precision
decoding against fp32, the CUDA RNG state of checkpoints, and updates under each
train.attention kernel.

`pytest -m cuda` runs them where a GPU is (scripts/gpu_check.sh does, with the benchmarks);
on a machine without one each test skips with the reason."""

import itertools

import pytest
import torch
from conftest import FIXTURES, run_cli, tiny_config

from translate.checkpoint import load_checkpoint, rng_state, set_rng_state
from translate.config import ModelConfig, load_config
from translate.decoding import translate_lines
from translate.errors import UserError
from translate.inference import load_models
from translate.model import Transformer
from translate.options import SearchOptions
from translate.tokenizer import PAD
from translate.train import Trainer

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def train_on_cuda(tmp_path, name, amp, **train):
    cfg = tiny_config(tmp_path, name=name, amp=amp, device="cuda", **{"max_steps": 60, "eval_every": 30, **train})
    result = run_cli("train", "--config", cfg)
    return result, load_checkpoint(tmp_path / "runs" / name / "checkpoints" / "last.pt")


def test_amp_auto_trains_in_bf16_where_the_gpu_has_it(tmp_path):
    result, ckpt = train_on_cuda(tmp_path, "auto", "auto")
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert f"-> {expected}" in result.stderr and ckpt["hardware"]["precision"] == expected
    assert ckpt["step"] == 60 and ckpt["progress"]["skipped"] == 0


def test_fp16_trains_with_the_gradient_scaler(tmp_path):
    _, ckpt = train_on_cuda(tmp_path, "fp16", "fp16")
    assert ckpt["hardware"]["precision"] == "fp16" and ckpt["scaler"]["scale"] > 0  # the scaler was in use
    assert ckpt["step"] == 60
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())


def test_checkpoint_rng_state_restores_cuda_draws():
    torch.cuda.manual_seed_all(3)
    state = rng_state(cuda=True)
    first = torch.rand(8, device="cuda")
    torch.rand(100, device="cuda")  # move on
    set_rng_state(state)
    assert torch.equal(torch.rand(8, device="cuda"), first)


def test_half_precision_decoding_agrees_with_fp32(tmp_path):
    """bf16 and fp16 decoding give mostly fp32's 1-best. The model is tiny and barely trained, so
    many hypotheses are near ties that a half-precision rounding flips (on an H200: bf16 85 % of
    the 40 fixture lines; CUDA training is not deterministic, so a rerun moves it by a few lines);
    the bar here is 70 %, lower than what a trained model should reach."""
    train_on_cuda(tmp_path, "dec", "off", max_steps=150, lr=3e-3)
    ckpt = tmp_path / "runs" / "dec" / "checkpoints" / "last.pt"
    lines = (FIXTURES / "bible.test.en").read_text(encoding="utf-8").splitlines()
    outputs = {}
    for dtype in ("fp32", "bf16", "fp16"):
        models, tokenizer, _ = load_models([ckpt], "cuda", dtype=dtype)
        outputs[dtype] = [n[0][0] for n in translate_lines(models, tokenizer, lines, SearchOptions(beam_size=4))]
    same = {d: sum(a == b for a, b in zip(outputs[d], outputs["fp32"])) / len(lines) for d in ("bf16", "fp16")}
    print(", ".join(f"{d}: {v:.0%} of 1-best lines equal to fp32's" for d, v in same.items()))
    assert all(v >= 0.7 for v in same.values()), same


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_training_updates_on_the_gpu_make_no_synchronisation(tmp_path, amp):
    """torch.cuda.set_sync_debug_mode("error") raises on any synchronisation: none in the updates
    after the first (which creates the optimizer's state and the libraries' handles)."""
    t = Trainer(load_config(tiny_config(tmp_path, name=amp, amp=amp, device="cuda", accumulate=2)), resume=False)
    planned = list(itertools.islice(t.planned_updates(0, 0), 4))
    t.update(planned[0].batches, planned[0].all_ntokens)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = [t.update(p.batches, p.all_ntokens) for p in planned[1:]]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not any(bool(r.skipped) for r in results) or amp == "fp16"  # fp16 may skip while its scale settles
    assert all(torch.isfinite(r.loss) for r in results)
    t.close()


@pytest.mark.parametrize("attention", ["auto", "cudnn", "flash", "efficient", "math"])
def test_every_attention_choice_trains(tmp_path, attention):
    """Each train.attention makes bf16 updates with the padding mask (flash, which takes no mask,
    with the memory-efficient kernel beside it); a kernel this GPU or torch lacks is a UserError."""
    cfg = tiny_config(tmp_path, name=attention, amp="bf16", device="cuda", attention=attention)
    t = Trainer(load_config(cfg), resume=False)
    try:
        results = [t.update(p.batches, p.all_ntokens) for p in itertools.islice(t.planned_updates(0, 0), 3)]
    except UserError as e:
        pytest.skip(str(e))
    finally:
        t.close()
    assert all(torch.isfinite(r.loss) and not bool(r.skipped) for r in results)


def test_the_additive_padding_mask_gives_the_boolean_masks_output():
    """On a GPU `forward` makes the padding mask additive once; encode/decode with the boolean one agree."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=2, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0)
    model = Transformer(cfg, 50).cuda().eval()
    src = torch.randint(4, 50, (3, 7), device="cuda")
    src[0, 4:] = PAD
    src[2, 2:] = PAD
    tgt = torch.randint(4, 50, (3, 5), device="cuda")
    with torch.no_grad():
        additive = model(src, tgt)
        memory, mask = model.encode(src)
        boolean = model.output(model.decode(tgt, memory, mask))
    assert mask.dtype == torch.bool
    torch.testing.assert_close(additive, boolean, atol=1e-5, rtol=1e-4)
