"""Search invariants (no golden floats) and hand-derived beams from a scripted decoder."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import tiny_model
from translate import model as model_module
from translate import search
from translate.config import ModelConfig
from translate.errors import UserError
from translate.model import Transformer
from translate.options import SearchOptions
from translate.search import (
    BeamSearch,
    Ensemble,
    Finished,
    Hypothesis,
    beam_search,
    beam_search_loop,
    gnmt_length_penalty,
    greedy_search,
    max_output_lengths,
    open_bound,
    split_candidates,
    top_candidates,
)
from translate.tokenizer import BOS, EOS, PAD, UNK

VOCAB = 50
INF = float("-inf")


def biased_model(seed: int = 0, eos_bias: float = 1.0) -> Transformer:
    """conftest's tiny model with an EOS bias on the output: its outputs mix EOS-ended and
    max-length hypotheses."""
    model = tiny_model(VOCAB, seed)
    bias = torch.zeros(VOCAB)
    bias[EOS] = eos_bias
    model.output.bias = torch.nn.Parameter(bias)
    return model


def make_src(lengths: list[int], seed: int = 1) -> torch.Tensor:
    """Random sources of these piece counts, + EOS, right-padded: (B, max + 1)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths) + 1), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, VOCAB, (n,), generator=g)
        src[i, n] = EOS
    return src


@pytest.fixture(scope="module")
def model() -> Transformer:
    return biased_model()


@pytest.fixture(scope="module")
def src() -> torch.Tensor:
    return make_src([3, 8, 5, 1, 7, 4])


def assert_same(a: list[Hypothesis], b: list[Hypothesis], tol: float = 1e-5) -> None:
    assert [h.tokens for h in a] == [h.tokens for h in b]
    for x, y in zip(a, b, strict=True):
        assert x.score == pytest.approx(y.score, abs=tol)
        assert x.log_prob == pytest.approx(y.log_prob, abs=tol)


# ---------------------------------------------------------------------------- the pieces


def test_gnmt_length_penalty():
    assert gnmt_length_penalty(7, 1.0).item() == pytest.approx(2.0)
    assert gnmt_length_penalty(torch.tensor([1, 13]), 0.5).tolist() == pytest.approx([1.0, math.sqrt(3.0)])
    assert gnmt_length_penalty(torch.tensor([3, 40]), 0.0).tolist() == [1.0, 1.0]


def test_max_output_lengths_counts_pieces_only():
    src = torch.tensor([[5, 6, 7, EOS], [5, EOS, PAD, PAD], [EOS, PAD, PAD, PAD]])
    assert max_output_lengths(src, 1.5, 2).tolist() == [int(1.5 * 3 + 2), int(1.5 * 1 + 2), 2]
    assert max_output_lengths(src, 0.0, 0).tolist() == [1, 1, 1]  # never below one token


def test_top_candidates_flattens_beam_and_vocab():
    scores = torch.tensor([[-1.0, -2.0]])  # one sentence, two beams
    logp = torch.log(torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]]))  # (2 beams, V=3)
    top, beam, token = top_candidates(scores, *logp.topk(2, dim=1), 3)  # each beam's 2 best hold the 3 best
    assert beam.tolist() == [[0, 0, 1]] and token.tolist() == [[2, 1, 0]]
    assert top[0].tolist() == pytest.approx([-1 + math.log(0.7), -1 + math.log(0.2), -2 + math.log(0.5)])


def test_split_candidates():
    tokens = torch.tensor([[EOS, 5, 6, EOS], [7, EOS, 8, 9]])
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-1.0, -2.0, -3.0, INF]])
    finish, go_on = split_candidates(scores, tokens, 2, last_step=torch.tensor([False, False]))
    assert finish.tolist() == [[True, False], [False, True]]  # EOS among the first k only
    assert go_on.tolist() == [[1, 2], [0, 2]]  # the first k that are not EOS
    finish, _ = split_candidates(scores, tokens, 2, last_step=torch.tensor([True, False]))
    assert finish.tolist() == [[True, True], [False, True]]  # at the last step every top-k ends
    finish, _ = split_candidates(torch.full((1, 4), INF), tokens[:1], 2, last_step=torch.tensor([True]))
    assert not finish.any()  # impossible candidates never end


def test_open_bound_uses_the_largest_reachable_penalty():
    scores = torch.tensor([[-3.0, -2.0, INF]])
    max_lens = torch.tensor([10])
    assert open_bound(scores, 2, max_lens, 1.0).item() == pytest.approx(-2.0 / ((5 + 10) / 6))
    assert open_bound(scores, 2, max_lens, -1.0).item() == pytest.approx(-2.0 / ((5 + 3) / 6) ** -1)
    assert open_bound(scores, 2, max_lens, 0.0).item() == pytest.approx(-2.0)


def test_finished_keeps_the_k_best():
    fin = Finished(n_sentences=1, k=2, width=4, device=torch.device("cpu"))
    assert fin.nth(1).item() == INF
    fin.add(torch.tensor([[-2.0, INF]]), torch.tensor([[-2.0, 0.0]]), 2, torch.tensor([[[5, EOS], [6, 7]]]))
    assert fin.nth(1).item() == -2.0 and fin.nth(2).item() == INF
    fin.add(torch.tensor([[-1.0, -3.0]]), torch.tensor([[-1.5, -4.0]]), 3, torch.tensor([[[8, 9, EOS], [8, 8, 8]]]))
    assert fin.nth(1).item() == -1.0 and fin.nth(2).item() == -2.0
    hyps = fin.hypotheses(0, 2)
    assert [h.tokens for h in hyps] == [[8, 9], [5]]  # EOS stripped
    assert [(h.score, h.log_prob) for h in hyps] == [(-1.0, -1.5), (-2.0, -2.0)]


def test_ensemble_of_one_is_the_model(model, src):
    tokens = torch.full((src.size(0),), BOS)
    with torch.inference_mode():
        ens = Ensemble([model])
        ens.start(src)
        got = ens.step(tokens)
        state = model.init_state(*model.encode(src))
        expected = torch.log_softmax(model.decode_step(tokens, state), dim=-1)
        expected[:, [PAD, BOS, EOS]] = INF  # the first step: no EOS yet
    assert torch.equal(got, expected)


# ---------------------------------------------------------------------------- a scripted decoder


class ScriptedModel:
    """A fake model with the Transformer's search interface (fairseq tests/utils.py style).

    The next-token probabilities come from `table[(marker, *prefix)]`, marker being the
    source's first token; a prefix not in the table ends: {EOS: 1}.
    """

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], vocab_size: int = 8) -> None:
        self.table, self.vocab_size, self.calls = table, vocab_size, 0

    def encode(self, src: torch.Tensor):
        return src[:, :1].float(), (src != PAD)[:, None, None, :]

    def init_state(self, memory: torch.Tensor, src_mask: torch.Tensor) -> list[tuple[int, ...]]:
        return [(int(m),) for m in memory[:, 0]]

    def decode_step(self, tokens: torch.Tensor, state: list[tuple[int, ...]]) -> torch.Tensor:
        self.calls += 1
        logits = torch.full((len(state), self.vocab_size), INF)
        for row, token in enumerate(tokens.tolist()):
            if token != BOS:
                state[row] = state[row] + (token,)
            for t, p in self.table.get(state[row], {EOS: 1.0}).items():
                logits[row, t] = math.log(p)
        return logits

    @staticmethod
    def reorder_state(state: list[tuple[int, ...]], index: torch.Tensor, keep=None) -> list[tuple[int, ...]]:
        return [state[i] for i in index.tolist()]


# Sentence 10: greedy stops at [4] (EOS at step 1); [4, 6, 7] is less probable but longer, and
# wins once the length penalty (alpha = 1) is applied.
TABLE = {
    (10,): {4: 0.6, 5: 0.4},
    (10, 4): {EOS: 0.55, 6: 0.45},
    (10, 5): {EOS: 0.7, 6: 0.3},
    (10, 4, 6): {7: 1.0},
    (11,): {5: 0.9, 4: 0.1},  # sentence 11 ends early: [5] with 0.9 * 0.8
    (11, 5): {EOS: 0.8, 6: 0.2},
}
SRC_10 = torch.tensor([[10, EOS]])  # one source piece: max length = b


def lp(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha


def scripted_beam(alpha: float, max_len_b: int, src: torch.Tensor = SRC_10, nbest: int = 2):
    model = ScriptedModel(TABLE)
    hyps = beam_search(
        [model], src, SearchOptions(beam_size=2, length_penalty=alpha, max_len_a=0, max_len_b=max_len_b, nbest=nbest)
    )
    return hyps, model.calls


def test_scripted_beam_alpha_0_stops_early():
    # Step 1 candidates: [4]+EOS .33, [5]+EOS .28, [4,6] .27, [5,6] .12 -> both EOS finish, and the
    # best open hypothesis (.27) cannot beat the worst finished one (.28) without a penalty.
    (hyps,), calls = scripted_beam(alpha=0.0, max_len_b=10)
    assert [h.tokens for h in hyps] == [[4], [5]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.6 * 0.55), math.log(0.4 * 0.7)])
    assert calls == 2


def test_scripted_beam_length_penalty_keeps_searching():
    # alpha = 1: after step 1 the open [4,6] (.27) could reach log(.27) / lp(10) > log(.28) / lp(2),
    # so the search goes on (a bound with the current length would have stopped) and finds [4,6,7].
    (hyps,), calls = scripted_beam(alpha=1.0, max_len_b=10)
    assert [h.tokens for h in hyps] == [[4, 6, 7], [4]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.27) / lp(4, 1), math.log(0.33) / lp(2, 1)])
    assert [h.log_prob for h in hyps] == pytest.approx([math.log(0.27), math.log(0.33)])
    assert calls == 4  # steps 0..3: [4,6,7]+EOS ends at step 3, then nothing open is left


def test_scripted_beam_stops_once_the_nbest_are_settled():
    # Sentence 12, beam 2, alpha 0. Step 1: [4]+EOS (.45) finishes; [5,6] (.3) and [5,7] (.2) go on.
    # For the 1-best nothing open can beat .45, so it stops there; a 2-best list still has a place
    # for them, so that search runs one step more. The best hypothesis is the same.
    table = {(12,): {4: 0.5, 5: 0.5}, (12, 4): {EOS: 0.9, 6: 0.1}, (12, 5): {6: 0.6, 7: 0.4}}
    src = torch.tensor([[12, EOS]])
    one, two = ScriptedModel(table), ScriptedModel(table)
    (best,) = beam_search(
        [one], src, SearchOptions(beam_size=2, length_penalty=0.0, max_len_a=0, max_len_b=10, nbest=1)
    )
    (both,) = beam_search(
        [two], src, SearchOptions(beam_size=2, length_penalty=0.0, max_len_a=0, max_len_b=10, nbest=2)
    )
    assert [h.tokens for h in best] == [[4]] and one.calls == 2
    assert [h.tokens for h in both] == [[4], [5, 6]] and two.calls == 3
    assert [h.score for h in both] == pytest.approx([math.log(0.45), math.log(0.3)])
    assert_same(best, both[:1], tol=0)


def test_scripted_beam_max_length_truncates():
    # max length 3: at step 2 the top candidates end as they are; [4,6,7] has no EOS.
    (hyps,), calls = scripted_beam(alpha=1.0, max_len_b=3)
    assert [h.tokens for h in hyps] == [[4], [4, 6, 7]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.33) / lp(2, 1), math.log(0.27) / lp(3, 1)])
    assert calls == 3


def test_scripted_batch_equals_one_at_a_time():
    src = torch.tensor([[11, 12, EOS], [10, EOS, PAD]])  # different lengths, padding
    batched, _ = scripted_beam(alpha=1.0, max_len_b=10, src=src)
    alone_11, _ = scripted_beam(alpha=1.0, max_len_b=10, src=src[:1])
    alone_10, _ = scripted_beam(alpha=1.0, max_len_b=10, src=src[1:, :2])
    assert_same(batched[0], alone_11[0])
    assert_same(batched[1], alone_10[0])
    assert batched[0][0].tokens == [5] and batched[0][0].score == pytest.approx(math.log(0.72) / lp(2, 1))


def test_no_sentence_translates_to_nothing():
    """EOS is never the first piece, however probable (a weak model's beam search would end many
    sentences at once, scored best by the length penalty), in greedy, beam and running searches;
    from the second piece on it may end."""
    table = {**TABLE, (12,): {EOS: 0.9, 4: 0.1}}
    src = torch.tensor([[12, EOS]])
    greedy = greedy_search([ScriptedModel(table)], src, 0, 10)
    assert greedy[0].tokens == [4] and greedy[0].log_prob == pytest.approx(math.log(0.1))  # then (12, 4): EOS
    for beam in (1, 2):
        assert beam_search([ScriptedModel(table)], src, SearchOptions(beam, 1.0, 0, 10))[0][0].tokens == [4]
    running = BeamSearch(Ensemble([biased_model(eos_bias=50.0)]), 3, 1.0, 1)
    sources = make_src([3, 5, 1])
    running.add(sources, max_output_lengths(sources, 1.0, 4), [0, 1, 2])
    results: dict[int, list[Hypothesis]] = {}
    while running.keys:
        results.update(running.step())
    assert sorted(results) == [0, 1, 2] and all(len(hyps[0].tokens) == 1 for hyps in results.values())


def test_scripted_greedy_and_one_wide_beam():
    greedy = greedy_search([ScriptedModel(TABLE)], SRC_10, 0, 10, length_penalty=1.0)
    assert greedy[0].tokens == [4] and greedy[0].score == pytest.approx(math.log(0.33) / lp(2, 1))
    assert_same(
        [h for hs in beam_search(ScriptedModel(TABLE), SRC_10, SearchOptions(1, 1.0, 0, 10)) for h in hs], greedy
    )
    # Why beam_size=1 is greedy by definition: the beam loop with k = 1 and the exact stopping
    # bound looks past greedy's EOS and finds the better-normalised [4, 6, 7].
    one_wide = beam_search_loop(Ensemble([ScriptedModel(TABLE)]), SRC_10, 1, 1.0, torch.tensor([10]), 1)
    assert one_wide[0][0].tokens == [4, 6, 7]


def test_scripted_ensemble_averages_probabilities():
    # Mean of probabilities: 4 -> (.7 + .001) / 2 = .3505 beats 6 (.3495) and 5 (.3);
    # a mean of log-probs would pick 5 (the only token both models like).
    a = ScriptedModel({(10,): {4: 0.7, 5: 0.3}})
    b = ScriptedModel({(10,): {4: 0.001, 5: 0.3, 6: 0.699}})
    (hyp,) = greedy_search([a, b], SRC_10, 0, 1)
    assert hyp.tokens == [4] and hyp.log_prob == pytest.approx(math.log(0.3505))


# ---------------------------------------------------------------------------- a random model


def test_greedy_cached_equals_full_recomputation(model, src):
    assert_same(greedy_search([model], src, 1.0, 5), greedy_search([model], src, 1.0, 5, use_cache=False))


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_greedy_same_whenever_finished_rows_leave(model, src, monkeypatch, share):
    """Finished rows leave the batch at a later step than they finish (COMPACT_SHARE): the
    outputs are those of dropping each at once (0.0) or only at the very end (1.0)."""
    default = greedy_search([model], src, 1.0, 5)
    monkeypatch.setattr(search, "COMPACT_SHARE", share)
    assert_same(greedy_search([model], src, 1.0, 5), default)  # tokens equal, scores within 1e-5


def test_beam_cached_equals_full_recomputation(model, src):
    cached = beam_search([model], src, SearchOptions(4, 0.6, 1.0, 5, nbest=4))
    full = beam_search([model], src, SearchOptions(4, 0.6, 1.0, 5, nbest=4), use_cache=False)
    for a, b in zip(cached, full, strict=True):
        assert_same(a, b)


def test_outputs_mix_eos_and_max_length(model, src):
    """The fixture exercises both ways a hypothesis ends (else the tests below prove less)."""
    max_lens = max_output_lengths(src, 1.0, 5).tolist()
    hyps = beam_search([model], src, SearchOptions(4, 0.6, 1.0, 5, nbest=4))
    lengths = [(len(h.tokens), max_len) for hs, max_len in zip(hyps, max_lens, strict=True) for h in hs]
    assert any(n < max_len - 1 for n, max_len in lengths) and any(n == max_len for n, max_len in lengths)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_1_equals_greedy(model, src, alpha):
    greedy = greedy_search([model], src, 1.0, 5, length_penalty=alpha)
    assert_same([hs[0] for hs in beam_search([model], src, SearchOptions(1, alpha, 1.0, 5))], greedy, tol=0)


def test_beam_loop_with_one_beam_and_no_penalty_is_greedy(model, src):
    greedy = greedy_search([model], src, 1.0, 5)
    max_lens = max_output_lengths(src, 1.0, 5)
    with torch.inference_mode():
        one_wide = beam_search_loop(Ensemble([model]), src, 1, 0.0, max_lens, 1)
    assert_same([hs[0] for hs in one_wide], greedy)


def test_nbest_first_equals_1best_and_is_sorted(model, src):
    best = beam_search([model], src, SearchOptions(5, 0.6, 1.0, 5))
    nbest = beam_search([model], src, SearchOptions(5, 0.6, 1.0, 5, nbest=5))
    max_lens = max_output_lengths(src, 1.0, 5).tolist()
    for one, many, max_len in zip(best, nbest, max_lens, strict=True):
        assert len(many) == 5
        assert_same(one, many[:1], tol=0)
        scores = [h.score for h in many]
        assert scores == sorted(scores, reverse=True)
        for h in many:  # the penalty counts EOS, when there is one (shorter than max_len)
            length = len(h.tokens) + (len(h.tokens) < max_len)
            assert h.score == pytest.approx(h.log_prob / lp(length, 0.6))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_batch_equals_one_sentence_at_a_time(model, src, beam_size):
    batched = beam_search([model], src, SearchOptions(beam_size, 0.6, 1.0, 5, nbest=beam_size))
    for row, hyps in enumerate(batched):
        n = int((src[row] != PAD).sum())
        alone = beam_search([model], src[row : row + 1, :n], SearchOptions(beam_size, 0.6, 1.0, 5, nbest=beam_size))
        assert_same(hyps, alone[0])


def test_sources_cut_to_the_longest_left(model):
    """When the sentence with the longest source leaves, the others' source keys/values are cut to
    the longest left, and their next logits do not change."""
    src = make_src([3, 7, 2])
    tokens = torch.randint(4, VOCAB, (2, 6))
    with torch.inference_mode():
        state = model.init_state(*model.encode(src))
        state = model.reorder_state(state, torch.arange(3).repeat_interleave(2), keep=torch.arange(3))
        model.decode_step(tokens[0], state)
        rows = torch.tensor([0, 1, 4, 5])  # sentence 1 (the longest) leaves
        cut = model.reorder_state(state, rows, keep=torch.tensor([0, 2]))
        assert cut.src_mask.size(-1) == 4 and all(c.mk.size(2) == 4 == c.mv.size(2) for c in cut.caches)
        alone = model.init_state(*model.encode(src[[0, 2], :4]))
        alone = model.reorder_state(alone, torch.arange(2).repeat_interleave(2), keep=torch.arange(2))
        model.decode_step(tokens[0, rows], alone)
        torch.testing.assert_close(
            model.decode_step(tokens[1, :4], cut), model.decode_step(tokens[1, :4], alone), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("ensemble", [1, 2])
@pytest.mark.parametrize("merge_waste,max_groups", [(160, 4), (0, 100), (0, 2)])
def test_sentences_joining_a_running_search_get_what_they_get_alone(
    model, ensemble, merge_waste, max_groups, monkeypatch
):
    """Continuous batching: sentences join between steps, whenever; each gets the n-best list
    it gets searched alone, and the decoder state stays as long as its oldest sentence, whether
    the sentences that join go to the youngest group of rows, each to its own, or groups merge."""
    monkeypatch.setattr(model_module, "GROUP_MERGE_WASTE", merge_waste)
    monkeypatch.setattr(model_module, "MAX_GROUPS", max_groups)
    models = [model, biased_model(seed=3)][:ensemble]
    src = make_src([3, 8, 5, 1, 7, 4, 9, 2, 6, 3], seed=2)
    max_lens = max_output_lengths(src, 1.0, 4)
    alone = [
        beam_search_loop(Ensemble(models), src[i : i + 1, : int((src[i] != PAD).sum())], 3, 0.6, max_lens[i : i + 1], 2)
        for i in range(src.size(0))
    ]
    search = BeamSearch(Ensemble(models), 3, 0.6, 2)
    joins = {0: [0, 1], 2: [2], 3: [3, 4, 5], 7: [6, 7], 20: [8], 21: [9]}  # step -> sentences that join before it
    results: dict[int, list[Hypothesis]] = {}
    most_groups = 0
    for step in range(60):
        if step in joins:
            search.add(src[joins[step]], max_lens[joins[step]], joins[step])
        if search.keys:
            results.update(search.step())
            state = search.ensemble.states[0]
            assert state.span <= int(max_lens.max())  # positions before the oldest dropped
            assert sum(g.rows for g in state.groups) == search.tokens.numel() and len(state.groups) <= max_groups
            most_groups = max(most_groups, len(state.groups))
    assert sorted(results) == list(range(src.size(0)))
    assert most_groups == 1 if merge_waste else most_groups >= 2  # the groups were exercised
    for i in range(src.size(0)):
        assert_same(results[i], alone[i][0])


def test_encoding_by_length_groups_equals_one_pass(model, src):
    """Groups of similar length, each cut to its longest source: the memory of every real source
    position is the one-pass memory, and the padding columns stay masked."""
    with torch.inference_mode():
        memory, mask = model.encode(src)
        grouped, grouped_mask = search.encode_by_length(model, src, rows=2)
    assert torch.equal(grouped_mask, mask)
    real = mask[:, 0, 0]
    torch.testing.assert_close(grouped[real], memory[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_search_same_when_encoded_by_length_groups(model, src, monkeypatch, beam_size):
    whole = beam_search([model], src, SearchOptions(beam_size, 0.6, 1.0, 5, nbest=beam_size))
    monkeypatch.setattr(search, "ENCODE_ROWS", 2)
    grouped = beam_search([model], src, SearchOptions(beam_size, 0.6, 1.0, 5, nbest=beam_size))
    for a, b in zip(grouped, whole, strict=True):
        assert_same(a, b)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_max_length_respected(src, beam_size):
    never_ends = biased_model(eos_bias=-1e4)
    max_lens = max_output_lengths(src, 0.5, 2).tolist()
    hyps = beam_search([never_ends], src, SearchOptions(beam_size, 0.6, 0.5, 2, nbest=beam_size))
    for hs, max_len in zip(hyps, max_lens, strict=True):
        assert [len(h.tokens) for h in hs] == [max_len] * beam_size


def test_never_pad_or_bos_but_unk_allowed(src):
    model = biased_model()
    with torch.no_grad():
        model.output.bias[[PAD, BOS, UNK]] = 50.0  # the model wants PAD, BOS and UNK above all
    for hs in beam_search([model], src, SearchOptions(3, 0.6, 1.0, 5, nbest=3)) + [
        [h] for h in greedy_search([model], src, 1, 5)
    ]:
        for h in hs:
            assert PAD not in h.tokens and BOS not in h.tokens
        assert hs[0].tokens[0] == UNK


def test_ensemble_of_two_identical_models_equals_one(model, src):
    for beam_size in (1, 4):
        one = beam_search([model], src, SearchOptions(beam_size, 0.6, 1.0, 5, nbest=beam_size))
        two = beam_search([model, model], src, SearchOptions(beam_size, 0.6, 1.0, 5, nbest=beam_size))
        for a, b in zip(one, two, strict=True):
            assert_same(a, b)


def test_ensemble_of_different_models_runs(model, src):
    other = biased_model(seed=3)
    hyps = beam_search([model, other], src, SearchOptions(3, 0.6, 1.0, 5, nbest=2))
    assert len(hyps) == src.size(0) and all(len(hs) == 2 for hs in hyps)
    assert_same(
        [hs[0] for hs in hyps], [hs[0] for hs in beam_search([model, other], src, SearchOptions(3, 0.6, 1.0, 5))]
    )


def test_nbest_larger_than_beam_is_an_error(model, src):
    with pytest.raises(UserError, match="nbest must be between 1 and the beam size"):
        beam_search([model], src, SearchOptions(2, 0.6, 1.0, 5, nbest=3))


# ---------------------------------------------------------------------------- the decoder state


def test_beams_share_the_source_keys_values(model):
    """k beams reading their sentence's one copy of the cross-attention keys/values give the same
    logits as k sentences each holding its own copy, and leaving sentences drop theirs."""
    src = make_src([3, 6])
    rows = torch.tensor([0, 0, 0, 1, 1, 1])  # 3 beams per sentence
    tokens = torch.randint(4, VOCAB, (4, 6))
    with torch.inference_mode():
        shared = model.init_state(*model.encode(src))
        shared = model.reorder_state(shared, rows, keep=torch.arange(2))
        copied = model.init_state(*model.encode(src[rows]))
        for t in range(3):
            torch.testing.assert_close(
                model.decode_step(tokens[t], shared), model.decode_step(tokens[t], copied), atol=1e-5, rtol=1e-5
            )
        assert shared.caches[0].mk.size(0) == 2 and copied.caches[0].mk.size(0) == 6
        beams = torch.tensor([4, 3, 3])  # sentence 0 leaves; sentence 1's beams reorder
        same = model.reorder_state(shared, torch.tensor([0, 0, 0, 1, 1, 1]), keep=torch.arange(2))
        assert same.caches[0].mk is shared.caches[0].mk  # nobody left: nothing copied
        shared = model.reorder_state(shared, beams, keep=torch.tensor([1]))
        copied = model.reorder_state(copied, beams)
        assert shared.src_mask.size(0) == 1 and shared.caches[0].mk.size(0) == 1
        torch.testing.assert_close(
            model.decode_step(tokens[3, :3], shared), model.decode_step(tokens[3, :3], copied), atol=1e-5, rtol=1e-5
        )


def test_outputs_stop_at_four_times_the_positions_whatever_the_options_say(src):
    """--max-len-b 1e8 would have a search hold 1e8 tokens a row: outputs stop at MAX_OUTPUT_FACTOR x
    max_positions (64 here), in greedy and beam search alike."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=2, d_ff=64, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=16)
    model = Transformer(cfg, VOCAB).eval()
    model.output.bias = torch.nn.Parameter(torch.zeros(VOCAB).index_fill(0, torch.tensor([EOS]), -1e4))
    assert [len(h.tokens) for h in greedy_search([model], src[:2], 0.0, 1e8)] == [64, 64]
    beams = beam_search([model], src[:2], SearchOptions(2, 0.6, 1e9, 0))
    assert [len(n[0].tokens) for n in beams] == [64, 64]
    assert max_output_lengths(src, 1e9, 1e9, limit=64).tolist() == [64] * src.size(0)


def test_decoding_past_the_position_table(src):
    """Outputs longer than max_positions: positions are computed on the fly under inference mode,
    the cached search still equals recomputation, and the model still trains afterwards."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=2, d_ff=64, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=16)
    model = Transformer(cfg, VOCAB).eval()
    model.output.bias = torch.nn.Parameter(torch.zeros(VOCAB).index_fill(0, torch.tensor([EOS]), -1e4))
    cached = greedy_search([model], src[:2], 0.0, 40)
    assert [len(h.tokens) for h in cached] == [40, 40]
    tol = 1e-4  # sums of 40 float32 log-probs near -60
    assert_same(cached, greedy_search([model], src[:2], 0.0, 40, use_cache=False), tol)
    for a, b in zip(
        beam_search([model], src[:2], SearchOptions(2, 0.6, 0.0, 40)),
        beam_search([model], src[:2], SearchOptions(2, 0.6, 0.0, 40), use_cache=False),
        strict=True,
    ):
        assert_same(a, b, tol)
    assert model.pe.size(0) == 16 and not model.pe.is_inference()
    model.train()
    model(src[:2], torch.randint(4, VOCAB, (2, 30))).sum().backward()  # training after decoding still works
    assert model.output.weight.grad is not None
