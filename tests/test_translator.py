"""translator.py: lines in, lines out — order, blank lines, long lines, streaming, file ends."""

from __future__ import annotations

import copy
import dataclasses
import random
import threading

import pytest
import torch

from translate import hardware
from translate.checkpoint import CHECKPOINT_FORMAT
from translate.config import Config, DecodeConfig, ModelConfig, config_to_dict
from translate.decoding import decode_batches, in_workers, translate_lines
from translate.engine import EngineSpec
from translate.errors import UserError
from translate.inference import check_precision, for_inference, keep_freed_memory, load_models
from translate.model import Transformer
from translate.options import SearchOptions
from translate.textio import read_lines, write_translations
from translate.tokenizer import Tokenizer
from translate.translator import decode_file, plot_attention, translate_file_lines

WORDS = (
    "the a cat dog house river green small big runs sees eats under over near old young bird tree stone "
    "water light night day mountain village quickly slowly beautiful garden window yellow purple"
).split()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(300)]
    return Tokenizer.train(sentences, vocab_size=48)


@pytest.fixture(scope="module")
def model(tokenizer) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=32,
        n_heads=2,
        d_ff=64,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_positions=32,
        tie_embeddings=False,  # a random tied model repeats one word; untied, the outputs differ by line
        init="xavier",  # larger random weights than N(0, 0.02): peaked, line-dependent outputs
    )
    return Transformer(cfg, tokenizer.vocab_size).eval()


LINES = [
    "the cat sees a bird",
    "a small green house near the river under the old tree quickly",
    "dog",
    "the young bird eats slowly in the beautiful garden near the yellow window at night",
    "water",
    "the old stone",
]

SEARCH = SearchOptions(beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=3)


def translate(model, tokenizer, lines, beam_size=SEARCH.beam_size, nbest=1, **kwargs):
    search = dataclasses.replace(SEARCH, beam_size=beam_size, nbest=nbest)
    return list(translate_lines(model, tokenizer, lines, search, **kwargs))


def assert_same(got: list, expected: list) -> None:
    """Same texts, same scores up to float noise (batch shapes differ)."""
    assert [[text for text, _ in hyps] for hyps in got] == [[text for text, _ in hyps] for hyps in expected]
    for a, b in zip(got, expected, strict=True):
        assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-5)


def test_order_kept_when_lengths_differ(model, tokenizer):
    batched = translate(model, tokenizer, LINES, batch_tokens=60)  # several batches, sorted by length
    alone = [translate(model, tokenizer, [line])[0] for line in LINES]
    assert len(batched) == len(LINES)
    assert len({hyps[0][0] for hyps in alone}) == len(LINES)  # the lines translate differently
    assert_same(batched, alone)


def test_workers_give_the_same_output_in_order(model, tokenizer):
    """Batches decoded two at a time, each on its share of the threads: the same translations in
    input order as one at a time; torch's thread count is restored."""
    threads = torch.get_num_threads()
    lines = [random.Random(i).choice(LINES) for i in range(30)]
    one = translate(model, tokenizer, lines, batch_tokens=120, workers=1, nbest=2)
    two = translate(model, tokenizer, lines, batch_tokens=240, workers=2, nbest=2)  # the same batches
    assert_same(two, one)
    assert torch.get_num_threads() == threads
    with pytest.raises(UserError, match="workers"):
        translate(model, tokenizer, lines, workers=-1)


def test_a_worker_error_reaches_the_caller(model, tokenizer, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr("translate.decoding.beam_search", out_of_memory)
    threads = torch.get_num_threads()
    with pytest.raises(UserError, match="out of memory"):
        translate(model, tokenizer, LINES, batch_tokens=40, workers=2)
    assert torch.get_num_threads() == threads


def test_in_workers_keeps_order_and_shares_threads():
    threads = max(2, torch.get_num_threads())
    torch.set_num_threads(threads)
    seen = []

    def work(i: int) -> int:
        seen.append(torch.get_num_threads())
        return i * i

    try:
        assert list(in_workers(work, list(range(20)), 2)) == [i * i for i in range(20)]
        assert set(seen) == {threads // 2}
        assert torch.get_num_threads() == threads
        assert list(in_workers(work, [3], 2)) == [9]  # one item: no threads
    finally:
        torch.set_num_threads(threads)


def test_keep_freed_memory():
    import platform

    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory() is expected


def test_chunks_and_streaming_give_the_same_output(model, tokenizer):
    whole = translate(model, tokenizer, LINES)
    assert_same(translate(model, tokenizer, iter(LINES), chunk_lines=2), whole)
    assert_same(translate(model, tokenizer, iter(LINES), stream=True, chunk_lines=4), whole)


def test_blank_lines_give_empty_lines(model, tokenizer):
    lines = ["", "the cat", "   ", "\t", "dog", ""]
    out = translate(model, tokenizer, lines, nbest=2)
    assert len(out) == len(lines)
    for i in (0, 2, 3, 5):
        assert out[i] == [("", 0.0), ("", 0.0)]
    assert all(len(hyps) == 2 for hyps in out)
    assert translate(model, tokenizer, ["", " "]) == [[("", 0.0)], [("", 0.0)]]
    assert translate(model, tokenizer, []) == []


def test_very_long_line_is_truncated_not_fatal(model, tokenizer):
    long_line = " ".join(WORDS * 40)  # far beyond max_positions = 32
    out = translate(model, tokenizer, ["the cat", long_line, "dog"])  # output up to 31 + 3 > 32 positions
    assert len(out) == 3 and all(len(hyps) == 1 for hyps in out)


def test_line_count_and_nbest_kept(model, tokenizer):
    lines = [random.Random(i).choice(LINES) for i in range(40)]
    out = translate(model, tokenizer, lines, nbest=3, batch_tokens=100, chunk_lines=7)
    assert len(out) == 40 and all(len(hyps) == 3 for hyps in out)
    for hyps in out:
        assert [s for _, s in hyps] == sorted((s for _, s in hyps), reverse=True)


def test_ensemble_of_two_identical_models(model, tokenizer):
    one = translate(model, tokenizer, LINES[:3])
    two = translate([model, model], tokenizer, LINES[:3])
    assert_same(two, one)


def test_stream_translates_a_line_before_the_next_arrives(model, tokenizer):
    more = threading.Event()

    def interactive():
        yield "the cat"
        assert more.wait(timeout=30)  # the user types the next line only after seeing a result
        yield "dog"

    results = translate_lines(model, tokenizer, interactive(), SEARCH, stream=True)
    first = next(results)
    more.set()
    rest = list(results)
    assert len(first) == 1 and len(rest) == 1


def test_lines_are_read_lazily(model, tokenizer):
    consumed = []

    def lines():
        for i in range(100):
            consumed.append(i)
            yield "the cat"

    results = translate_lines(model, tokenizer, lines(), SEARCH, chunk_lines=5)
    next(results)
    assert len(consumed) <= 6


def test_reading_errors_reach_the_caller_in_stream_mode(model, tokenizer):
    def lines():
        yield "the cat"
        raise UserError("in.en:2: not UTF-8")

    results = translate_lines(model, tokenizer, lines(), SEARCH, stream=True)
    with pytest.raises(UserError, match="in.en:2"):
        list(results)


def test_models_train_mode_is_restored(model, tokenizer):
    model.train()
    try:
        translate(model, tokenizer, ["the cat"])
        assert model.training
    finally:
        model.eval()


def test_nbest_beyond_beam_is_a_user_error(model, tokenizer):
    with pytest.raises(UserError, match="nbest"):
        translate_lines(model, tokenizer, ["the cat"], SearchOptions(beam_size=3, nbest=4))  # raised before iterating


def test_token_batches_respect_the_budget():
    lengths = [5, 30, 7, 7, 12, 3, 50]
    batches = decode_batches(lengths, batch_tokens=60, beam_size=2)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * 2 * longest <= 60
    assert batches[0] == [6]  # longest first, alone when over budget


# ---------------------------------------------------------------------------- the file ends


def test_read_lines(tmp_path):
    path = tmp_path / "in.en"
    path.write_bytes("\ufefffirst\r\nsecond\n\nlast".encode())
    assert list(read_lines(path)) == ["first", "second", "", "last"]
    path.write_bytes(b"good\nbad \xff here\n")
    lines = read_lines(path)
    assert next(lines) == "good"
    with pytest.raises(UserError, match=r"in\.en:2: not UTF-8"):
        next(lines)
    with pytest.raises(UserError, match="not found"):
        read_lines(tmp_path / "missing.en")


def test_write_text_and_tsv(tmp_path):
    translations = [[("le chat", -0.5), ("un chat", -0.75)], [("", 0.0), ("", 0.0)], [("a\nb\tc", -1.0)] * 2]
    out = tmp_path / "out.fr"
    assert write_translations(translations, out) == 3
    assert out.read_text(encoding="utf-8") == "le chat\nun chat\n\n\na b\tc\na b\tc\n"
    assert write_translations(translations, out, nbest_format="tsv") == 3
    assert out.read_text(encoding="utf-8").splitlines() == [
        "0\t-0.5000\tle chat",
        "0\t-0.7500\tun chat",
        "1\t0.0000\t",
        "1\t0.0000\t",
        "2\t-1.0000\ta b c",
        "2\t-1.0000\ta b c",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["out.fr"]


def test_write_error_leaves_the_old_file(tmp_path):
    out = tmp_path / "out.fr"
    out.write_text("old\n")

    def failing():
        yield [("new", 0.0)]
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_translations(failing(), out)
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.fr"]


def test_write_stdout(capsys, model, tokenizer):
    n = write_translations(translate_lines(model, tokenizer, ["the cat", "", "dog"], SEARCH), "-")
    lines = capsys.readouterr().out.split("\n")
    assert n == 3 and len(lines) == 4 and lines[1] == "" and lines[3] == ""


# ---------------------------------------------------------------------------- checkpoints in (the CLI's calls)


@pytest.fixture(scope="module")
def checkpoint(model, tokenizer, tmp_path_factory):
    cfg = dataclasses.replace(
        Config(), model=model.cfg, decode=DecodeConfig(beam_size=2, max_len_a=1.0, max_len_b=3, batch_tokens=200)
    )
    path = tmp_path_factory.mktemp("run") / "best.pt"
    ckpt = {
        "format": CHECKPOINT_FORMAT,
        "config": config_to_dict(cfg),
        "vocab_size": tokenizer.vocab_size,
        "spm_model": tokenizer.model_bytes,
        "model": model.state_dict(),
    }
    torch.save(ckpt, path)
    return path


def spec(*checkpoints, **options) -> EngineSpec:
    return EngineSpec.of(checkpoints, device="cpu", **options)


def test_decode_file_nbest_tsv(checkpoint, tmp_path):
    src, out = tmp_path / "in.en", tmp_path / "out.fr"
    src.write_text("the cat sees a bird\n\ndog\n", encoding="utf-8")
    assert decode_file(spec(checkpoint, nbest=2), src, out, with_scores=True) == 3
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "1", "1", "2", "2"] and rows[2][2] == ""
    assert decode_file(spec(checkpoint, checkpoint, beam_size=1), src, out) == 3  # an ensemble, greedy
    assert len(out.read_text(encoding="utf-8").split("\n")) == 4


def test_decode_file_refuses_to_overwrite_its_input(checkpoint, tmp_path):
    src = tmp_path / "in.en"
    src.write_text("dog\n", encoding="utf-8")
    with pytest.raises(UserError, match="input file"):
        decode_file(spec(checkpoint), src, src)
    assert src.read_text(encoding="utf-8") == "dog\n"


def test_ensemble_needs_one_vocabulary(checkpoint, tmp_path):
    other = Tokenizer.train([" ".join(WORDS[i : i + 5]) for i in range(len(WORDS) - 5)] * 10, vocab_size=40)
    ckpt = torch.load(checkpoint, weights_only=True)
    ckpt["spm_model"] = other.model_bytes
    torch.save(ckpt, tmp_path / "other.pt")
    with pytest.raises(UserError, match="vocabulary"):
        load_models([checkpoint, tmp_path / "other.pt"])


def test_translate_file_lines(checkpoint, tmp_path):
    out = tmp_path / "hyp.fr"
    hyps = translate_file_lines(spec(checkpoint), ["the cat", "", "dog"], output=out)
    assert len(hyps) == 3 and hyps[1] == ""
    assert out.read_text(encoding="utf-8").split("\n")[:3] == hyps


def test_plot_attention(checkpoint, tmp_path):
    out = tmp_path / "attn.png"
    text = plot_attention(checkpoint, "the cat sees a bird", out, layer=0, head=1)
    assert isinstance(text, str) and out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(UserError, match="layer"):
        plot_attention(checkpoint, "the cat", out, layer=5)


# ---------------------------------------------------------------------------- precision


def test_int8_quantized_model_decodes(checkpoint, tmp_path):
    (quantized,), _, _ = load_models([checkpoint], "cpu", quantize="int8")
    linear = quantized.decoder[0].self_attn.W_q
    assert not isinstance(linear, torch.nn.Linear) and "quantized" in type(linear).__module__
    assert "quantized" in type(quantized.output).__module__  # the tied output projection too
    src, out = tmp_path / "in.en", tmp_path / "out.fr"
    src.write_text("the cat sees a bird\n\ndog\nthe old stone\n", encoding="utf-8")
    assert decode_file(spec(checkpoint, nbest=2, quantize="int8"), src, out) == 4
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 9 and lines[2] == lines[3] == "" and lines[0]


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
