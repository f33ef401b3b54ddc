"""inference.py: checkpoints loaded for decoding — ensembles, int8, precision, packed linears."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import LINES, WORDS
from translate import hardware
from translate.engine import Engine, EngineSpec
from translate.errors import UserError
from translate.inference import check_precision, for_inference, keep_freed_memory, load_models
from translate.options import SearchOptions
from translate.tokenizer import Tokenizer

SEARCH = SearchOptions(beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=3)


def translate(model, tokenizer, lines, beam_size=3, nbest=1):
    return list(Engine.from_model(model, tokenizer, SEARCH.given(beam_size=beam_size, nbest=nbest)).translate(lines))


def test_keep_freed_memory():
    import platform

    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory() is expected


def test_ensemble_needs_one_vocabulary(tiny_checkpoint, tmp_path):
    other = Tokenizer.train([" ".join(WORDS[i : i + 5]) for i in range(len(WORDS) - 5)] * 10, vocab_size=40)
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    ckpt["spm_model"] = other.model_bytes
    torch.save(ckpt, tmp_path / "other.pt")
    with pytest.raises(UserError, match="vocabulary"):
        load_models([tiny_checkpoint, tmp_path / "other.pt"])


def test_int8_quantized_model_decodes(tiny_checkpoint):
    engine = Engine.load(EngineSpec([tiny_checkpoint], device="cpu", quantize="int8", nbest=2))
    (quantized,) = engine.models
    linear = quantized.decoder[0].self_attn.W_q
    assert not isinstance(linear, torch.nn.Linear) and "quantized" in type(linear).__module__
    assert "quantized" in type(quantized.output).__module__  # the output projection too
    out = list(engine.translate(["the cat sees a bird", "", "dog", "the old stone"]))
    assert len(out) == 4 and all(len(nbest) == 2 for nbest in out)
    assert out[1] == [("", 0.0), ("", 0.0)] and out[0][0][0]


def test_precision_options_follow_the_device(model, tokenizer, monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(hardware, "_cpu_info", hardware.CpuInfo("AVX2", False, "mocked", 2))
    assert check_precision(cpu) == "fp32"
    assert check_precision(cpu, "fp32", "int8") == "fp32"
    assert check_precision(cuda, "bf16") == "bf16" and check_precision(cuda) == "bf16"
    assert check_precision(cuda, "fp16") == "fp16"
    for device, dtype, quantize, message in [
        (cpu, "bf16", None, "no native bf16"),
        (cpu, "fp16", None, "for CUDA"),
        (cpu, "bf16", "int8", "replaces --dtype bf16"),
        (cuda, "fp32", "int8", "for CPU"),
        (cpu, "float8", None, "--dtype must be"),
        (cpu, "fp32", "int4", "--quantize must be"),
    ]:
        with pytest.raises(UserError, match=message):
            check_precision(device, dtype, quantize)
    assert next(for_inference(model).parameters()).dtype == torch.float32
    half = for_inference(copy.deepcopy(model), "bf16")
    assert next(half.parameters()).dtype == torch.bfloat16
    out = translate(half, tokenizer, LINES[:2], nbest=2)  # the search runs in half precision (here on CPU)
    assert len(out) == 2 and all(len(hyps) == 2 and isinstance(hyps[0][1], float) for hyps in out)


def test_packed_linears_decode_as_the_model(model, tokenizer, monkeypatch):
    """fp32 on CPU: for_inference packs the linear layers for oneDNN in a copy; same logits within
    float rounding, same translations, the model itself untouched. Without oneDNN it is the model."""
    from translate.inference import PackedLinear, can_pack_linear

    if not can_pack_linear():
        pytest.skip("this torch build has no oneDNN packed linear")
    packed = for_inference(model)
    assert packed is not model and isinstance(packed.output, PackedLinear)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    tgt = torch.tensor([[2, 10, 11], [2, 12, 13]])
    with torch.inference_mode():
        torch.testing.assert_close(packed(src, tgt), model(src, tgt), atol=1e-4, rtol=1e-4)
    for beam in (1, 3):
        ours, theirs = (
            translate(m, tokenizer, LINES, beam_size=beam, nbest=2 if beam > 1 else 1) for m in (packed, model)
        )
        assert [[text for text, _ in hyps] for hyps in ours] == [[text for text, _ in hyps] for hyps in theirs]
        for a, b in zip(ours, theirs, strict=True):
            assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-4)
    monkeypatch.setattr("translate.inference.can_pack_linear", lambda: False)
    assert for_inference(model) is model


def test_packed_linear_is_checked_against_f_linear(monkeypatch, model):
    """The private oneDNN ops are used only where they agree with F.linear; a build where they
    disagree (or fail) decodes through the model's own nn.Linear layers."""
    from translate import inference

    inference.can_pack_linear.cache_clear()
    try:
        if inference.can_pack_linear():  # this build: they agree, and the fp32 CPU model is packed
            assert any(isinstance(m, inference.PackedLinear) for m in for_inference(model).modules())
        wrong = lambda x, w, b, *a: torch.zeros(x.shape[0], b.shape[0] if b is not None else 40)  # noqa: E731
        monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", wrong, raising=False)
        inference.can_pack_linear.cache_clear()
        assert not inference.can_pack_linear()
        plain = for_inference(model)
        assert not any(isinstance(m, inference.PackedLinear) for m in plain.modules())
    finally:
        monkeypatch.undo()
        inference.can_pack_linear.cache_clear()


def test_decoded_text_ends_in_no_space(tokenizer):
    """A hypothesis that ends on the bare '▁' piece reads as the text before it (as Hugging Face's tokenizer does)."""
    from translate.tokenizer import BOS, EOS

    ids = tokenizer.encode(["the cat"])[0]
    space = tokenizer.sp.piece_to_id("▁")
    assert space != tokenizer.sp.unk_id()
    assert tokenizer.decode([[BOS, *ids, space, EOS], ids]) == ["the cat", "the cat"]
