"""Greedy and beam search, outside the model, over encode / init_state / decode_step / reorder_state.

Shapes: B sentences, N sentences still searching, k beam size, V vocabulary, t tokens so far.

Conventions (see model.py): a source row is its pieces + EOS, right-padded with PAD; the
decoder starts from BOS; a hypothesis ends at EOS. PAD and BOS are never produced (their
log-probs are -inf), nor EOS at the first step (a hypothesis has at least one piece, as
CTranslate2's min_decoding_length 1); UNK may be. The maximum output length of a sentence is
`int(max_len_a * src_len + max_len_b)` tokens (at least 1), EOS included, where src_len counts
the source's pieces (no EOS, no padding); a hypothesis that reaches it without EOS ends there.

Scores: `log_prob` is the sum of the token log-probs (EOS included when generated); `score` is
log_prob / lp with the GNMT length penalty lp = ((5 + len) / 6) ** alpha, len counting EOS.

The pieces, each small and tested on its own: `encode_by_length` (the encoder over groups of
similar length), `Ensemble` (the models behind one step function), `gnmt_length_penalty`,
`max_output_lengths`, `top_candidates` (top-n over beam x vocab per sentence, from each beam's
own top-n), `split_candidates` (which finish, which go on),
`Finished` (the k best finished hypotheses per sentence, as tensors), `open_bound` (the best
score an open hypothesis can still reach), then the two loops `greedy_search` and `beam_search`
(both under torch.inference_mode; beam_size 1 is greedy). An ensemble averages the models'
probabilities at every step. Finished sentences leave the batch (beam search: at once; greedy:
once a quarter of its rows has finished): their rows of the decoder state are dropped, so a
long sentence does not slow the others down. The beam loop is a `BeamSearch` object that new
sentences may also join between steps (continuous batching, for `translate serve`): they start
at position 0 beside sentences already under way (see Transformer.join_state). About 460
lines: the pieces above and the two loops that use them, kept together so that the search can
be read in one place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from translate.options import SearchOptions
from translate.tokenizer import BOS, EOS, PAD

NEG_INF = float("-inf")
COMPACT_SHARE = 0.25  # greedy: drop finished rows from the batch once this share of its rows has finished
ENCODE_ROWS = 64  # the encoder runs over groups of this many sentences of similar length
MAX_OUTPUT_FACTOR = 4  # no output longer than 4x the models' positions, whatever --max-len-a/b say


@dataclass
class Hypothesis:
    tokens: list[int]  # output pieces, without EOS
    score: float  # log_prob / length penalty
    log_prob: float = 0.0  # sum of the token log-probs, EOS included when generated


# ---------------------------------------------------------------------------- the models


@dataclass
class PrefixState:
    """No-cache decoding state: the encoder output and the whole prefix, re-read every step."""

    memory: torch.Tensor  # (B, S, D)
    src_mask: torch.Tensor  # (B, 1, 1, S)
    prefix: torch.Tensor  # (B, t) BOS + tokens so far

    def select(self, index: torch.Tensor) -> PrefixState:
        return PrefixState(self.memory[index], self.src_mask[index], self.prefix[index])


def encode_by_length(model: Any, src: torch.Tensor, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """model.encode(src) over groups of `rows` (default ENCODE_ROWS) sentences of similar length,
    each group cut to its longest source, so that a large batch of mixed lengths pays for little
    padding (the encoder's cost grows with the padded width; the decoder then takes rows by the
    hundred). src (B, S) right-padded -> memory (B, S, D), zero past each group's width where the
    source mask is False anyway, and src_mask (B, 1, 1, S)."""
    rows = rows or ENCODE_ROWS
    if src.size(0) <= rows:
        return model.encode(src)
    src_mask = (src != PAD)[:, None, None, :]
    lengths = src_mask[:, 0, 0].sum(dim=1)  # (B,)
    memory = None
    for group in lengths.argsort(descending=True, stable=True).split(rows):
        width = max(1, int(lengths[group[0]]))
        part, _ = model.encode(src[group, :width])  # (rows, width, D)
        if memory is None:
            memory = part.new_zeros(src.size(0), src.size(1), part.size(2))
        memory[group, :width] = part
    return memory, src_mask


class Ensemble:
    """One or more models behind one step function; it holds each model's decoder state.

    The ensemble's next-token distribution is the mean of the models' probabilities, returned
    as its log: logsumexp_m(log p_m) - log M (as fairseq). One model is passed through as is.
    With use_cache=False every step re-runs the decoder over the whole prefix with
    `model.decode` + `model.output` (the slow reference for tests and benchmarks).
    """

    def __init__(self, models: Sequence[Any] | Any, use_cache: bool = True) -> None:
        self.models = [models] if hasattr(models, "decode_step") else list(models)
        if not self.models:
            raise ValueError("an ensemble needs at least one model")
        self.use_cache = use_cache
        self.states: list[Any] = []

    @property
    def max_output(self) -> int | None:
        """The longest output the models are asked for, if they say: MAX_OUTPUT_FACTOR times the
        fewest positions (their sources are cut to these; outputs may pass them, within reason)."""
        known = [m.cfg.max_positions for m in self.models if hasattr(getattr(m, "cfg", None), "max_positions")]
        return MAX_OUTPUT_FACTOR * min(known) if known else None

    def start(self, src: torch.Tensor) -> None:
        """Encode src (B, S) once per model; the states get one row per sentence."""
        self.states = []
        for model in self.models:
            memory, src_mask = encode_by_length(model, src)
            if self.use_cache:
                self.states.append(model.init_state(memory, src_mask))
            else:
                self.states.append(PrefixState(memory, src_mask, src.new_empty((src.size(0), 0))))

    def join(self, src: torch.Tensor, beams: int) -> None:
        """New sentences src (B, S) join the running states with `beams` rows each (Transformer.join_state)."""
        if not self.use_cache:
            raise ValueError("sentences can join a search only with use_cache=True")
        for i, model in enumerate(self.models):
            memory, src_mask = encode_by_length(model, src)
            self.states[i] = model.join_state(self.states[i], model.init_state(memory, src_mask), beams)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (R,) the last token of each row -> log-probs (R, V) of the next one, PAD/BOS at -inf
        (and EOS in the rows at their first step)."""
        logps = [
            torch.log_softmax(self._logits(m, s, tokens).float(), dim=-1)
            for m, s in zip(self.models, self.states, strict=True)
        ]
        if len(logps) == 1:
            logp = logps[0]
        else:
            logp = torch.logsumexp(torch.stack(logps), dim=0) - math.log(len(logps))  # (R, V)
        logp[:, PAD] = NEG_INF
        logp[:, BOS] = NEG_INF
        # no EOS first: a non-blank source never translates to nothing (a row's last token is BOS
        # only at its first step; where, not a mask's index, so that a GPU need not synchronise)
        logp[:, EOS] = torch.where(tokens == BOS, NEG_INF, logp[:, EOS])
        return logp

    def top(self, tokens: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (R,) -> each row's n most probable next tokens: log-probs (R, n) and ids (R, n), best first."""
        logp = self.step(tokens)
        return logp.topk(min(n, logp.size(1)), dim=1)

    def _logits(self, model: Any, state: Any, tokens: torch.Tensor) -> torch.Tensor:
        if self.use_cache:
            return model.decode_step(tokens, state)
        state.prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)  # (R, t+1)
        hidden = model.decode(state.prefix, state.memory, state.src_mask)  # (R, t+1, D)
        return model.output(hidden[:, -1])

    def reorder(self, index: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Follow the beams: state row r becomes row index[r]; keep (N',) the sentences that stay
        (see Transformer.reorder_state; None: one row per sentence, index picks sentences)."""
        if self.use_cache:
            self.states = [m.reorder_state(s, index, keep) for m, s in zip(self.models, self.states, strict=True)]
        else:
            self.states = [s.select(index) for s in self.states]


# ---------------------------------------------------------------------------- small pieces


def gnmt_length_penalty(lengths: torch.Tensor | int, alpha: float) -> torch.Tensor:
    """GNMT length penalty ((5 + len) / 6) ** alpha, float32, same shape as lengths."""
    lengths = torch.as_tensor(lengths, dtype=torch.float32)
    return ((5.0 + lengths) / 6.0) ** alpha


def normalize(log_probs: torch.Tensor, lengths: torch.Tensor | int, alpha: float) -> torch.Tensor:
    """Length-normalised scores: log_probs / gnmt_length_penalty(lengths)."""
    return log_probs / gnmt_length_penalty(lengths, alpha).to(log_probs.device)


def max_output_lengths(src: torch.Tensor, max_len_a: float, max_len_b: float, limit: int | None = None) -> torch.Tensor:
    """src (B, S) -> (B,) int(a * src_len + b), at least 1 and at most `limit` (Ensemble.max_output);
    src_len counts pieces (no PAD, no EOS)."""
    src_len = ((src != PAD) & (src != EOS)).sum(dim=1).double()
    lengths = (max_len_a * src_len + max_len_b).clamp(max=limit if limit is not None else float("inf"))
    return lengths.long().clamp(min=1)


def top_candidates(scores: torch.Tensor, logp: torch.Tensor, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """The n best one-token extensions of each sentence's beams, best first.

    scores (N, k) the open hypotheses' log-probs; logp, ids (N*k, n) each beam's n best next tokens
    (which hold the sentence's n best extensions) -> candidate scores, parent beam (0..k-1) and
    token, each (N, n).
    """
    (N, k), m = scores.shape, logp.size(1)
    total = (scores.reshape(N * k, 1) + logp).view(N, k * m)  # (N, k*m)
    top, flat = total.topk(min(n, k * m), dim=1)
    return top, flat // m, ids.view(N, k * m).gather(1, flat)


def split_candidates(
    cand_scores: torch.Tensor, cand_tokens: torch.Tensor, k: int, last_step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which candidates finish and which go on (fairseq's rule).

    cand_scores, cand_tokens (N, n) best first, last_step (N,) bool -> finish (N, k): the first k
    candidates that end here (EOS, or every one at the last allowed step; never a -inf one), and
    go_on (N, k): the positions of the first k candidates that are not EOS.
    """
    n = cand_tokens.size(1)
    is_eos = cand_tokens == EOS  # (N, n)
    finish = (is_eos[:, :k] | last_step[:, None]) & (cand_scores[:, :k] > NEG_INF)
    rank = torch.arange(n, device=cand_tokens.device) + is_eos * n  # EOS candidates sort last
    go_on = rank.topk(k, dim=1, largest=False).indices  # (N, k) ascending rank
    return finish, go_on


def open_bound(scores: torch.Tensor, length: torch.Tensor | int, max_lens: torch.Tensor, alpha: float) -> torch.Tensor:
    """The best normalised score any open hypothesis of each sentence can still reach.

    scores (N, k) log-probs of hypotheses of `length` tokens ((N,) or one for all), max_lens (N,)
    -> (N,). Log-probs only fall as tokens are added, so the bound is the best log-prob over the
    largest penalty the final length can have: lp(max_len) for alpha >= 0, lp(length + 1) for alpha < 0.
    """
    best = scores.max(dim=1).values  # (N,) <= 0
    lp = torch.maximum(gnmt_length_penalty(max_lens, alpha), gnmt_length_penalty(length + 1, alpha))  # (N,)
    return best / lp


class Finished:
    """The k best finished hypotheses of each active sentence, best first, held as tensors."""

    def __init__(self, n_sentences: int, k: int, width: int, device: torch.device) -> None:
        self.k, self.width = k, width
        self.scores = torch.full((n_sentences, k), NEG_INF, device=device)  # normalised; -inf = empty
        self.log_probs = torch.zeros(n_sentences, k, device=device)
        self.lengths = torch.zeros(n_sentences, k, dtype=torch.long, device=device)
        self.tokens = torch.zeros(n_sentences, k, width, dtype=torch.long, device=device)

    def add(
        self, scores: torch.Tensor, log_probs: torch.Tensor, length: torch.Tensor | int, tokens: torch.Tensor
    ) -> None:
        """New finished candidates: scores (N, c) normalised (-inf = none), log_probs (N, c),
        length (N,) (or one for all) and tokens (N, c, L): each one's first `length`, L <= width.
        Keeps the k best of old and new."""
        all_scores = torch.cat([self.scores, scores], dim=1)  # (N, k+c)
        self.scores, pos = all_scores.topk(self.k, dim=1)  # (N, k)
        self.log_probs = torch.cat([self.log_probs, log_probs], dim=1).gather(1, pos)
        lengths = torch.as_tensor(length, device=scores.device).view(-1, 1).expand_as(scores)
        self.lengths = torch.cat([self.lengths, lengths], dim=1).gather(1, pos)
        tokens = F.pad(tokens, (0, self.width - tokens.size(2)))  # (N, c, width)
        tokens = torch.cat([self.tokens, tokens], dim=1)  # (N, k+c, width)
        self.tokens = tokens.gather(1, pos[:, :, None].expand(-1, -1, self.width))

    def join(self, other: Finished) -> None:
        """Another Finished's sentences after these (the tokens of both padded to the wider)."""
        width = max(self.width, other.width)
        self.tokens = torch.cat([F.pad(f.tokens, (0, width - f.width)) for f in (self, other)])
        self.scores, self.log_probs = (
            torch.cat([self.scores, other.scores]),
            torch.cat([self.log_probs, other.log_probs]),
        )
        self.lengths, self.width = torch.cat([self.lengths, other.lengths]), width

    def nth(self, n: int) -> torch.Tensor:
        """(N,) the n-th best finished score (-inf while fewer than n have finished), n <= k."""
        return self.scores[:, n - 1]

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the sentences `keep` (indices into the active ones)."""
        self.scores, self.log_probs = self.scores[keep], self.log_probs[keep]
        self.lengths, self.tokens = self.lengths[keep], self.tokens[keep]

    def hypotheses(self, i: int, nbest: int) -> list[Hypothesis]:
        """Active sentence i's nbest finished hypotheses, best first."""
        scores, log_probs = self.scores[i, :nbest].tolist(), self.log_probs[i, :nbest].tolist()
        lengths, tokens = self.lengths[i, :nbest].tolist(), self.tokens[i, :nbest].tolist()
        out = []
        for score, log_prob, length, toks in zip(scores, log_probs, lengths, tokens, strict=True):
            if score > NEG_INF:
                out.append(Hypothesis(strip_eos(toks[:length]), score, log_prob))
        return out


def strip_eos(tokens: list[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] == EOS else tokens


# ---------------------------------------------------------------------------- greedy


@torch.inference_mode()
def greedy_search(
    models: Sequence[Any] | Any,
    src: torch.Tensor,
    max_len_a: float,
    max_len_b: float,
    length_penalty: float = 0.0,
    use_cache: bool = True,
) -> list[Hypothesis]:
    """The most probable next token at every step, for a batch src (B, S); one hypothesis each.

    A sentence is done as soon as it emits EOS or reaches its maximum length; its row leaves the
    batch once a quarter of the rows is done (COMPACT_SHARE). beam_search passes the search
    options (options.SearchOptions) on with beam size 1; length_penalty (alpha) only rescales the
    reported score, as beam search would.
    """
    B = src.size(0)
    if B == 0:
        return []
    ensemble = Ensemble(models, use_cache)
    ensemble.start(src)
    max_lens = max_output_lengths(src, max_len_a, max_len_b, ensemble.max_output).to(src.device)
    ids = torch.arange(B, device=src.device)  # original sentence of each row
    alive = torch.ones(B, dtype=torch.bool, device=src.device)  # rows still searching
    tokens = src.new_full((B,), BOS)
    log_probs = torch.zeros(B, device=src.device)
    history = src.new_empty((B, 0))  # (N, t)
    results: list[Hypothesis | None] = [None] * B
    for step in range(int(max_lens.max())):
        best, tokens = (t[:, 0] for t in ensemble.top(tokens, 1))  # (N,), (N,)
        log_probs = log_probs + best
        history = torch.cat([history, tokens[:, None]], dim=1)  # (N, t+1)
        done = alive & ((tokens == EOS) | (max_lens <= step + 1))
        if not done.any():
            continue
        scores = normalize(log_probs[done], step + 1, length_penalty).tolist()
        rows = zip(ids[done].tolist(), history[done].tolist(), scores, log_probs[done].tolist(), strict=True)
        for i, toks, score, log_prob in rows:
            results[i] = Hypothesis(strip_eos(toks), score, log_prob)
        alive &= ~done
        n_alive = int(alive.sum())
        if n_alive == 0:
            break
        if n_alive <= (1 - COMPACT_SHARE) * alive.numel():
            # drop the finished rows; until enough have finished they ride along (copying the
            # cache at every finish would cost more than decoding a few extra rows)
            keep = alive.nonzero().squeeze(1)
            ensemble.reorder(keep)
            ids, tokens, log_probs, alive = ids[keep], tokens[keep], log_probs[keep], alive[keep]
            history, max_lens = history[keep], max_lens[keep]
    return results  # type: ignore[return-value]


# ---------------------------------------------------------------------------- beam


@torch.inference_mode()
def beam_search(
    models: Sequence[Any] | Any,
    src: torch.Tensor,
    options: SearchOptions = SearchOptions(),
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """Beam search for a batch src (B, S) -> per sentence its options.nbest hypotheses, best first.

    beam_size 1 is greedy search. (With alpha > 0 a one-wide beam under the exact stopping rule
    below would keep looking past greedy's EOS for a longer, better-normalised hypothesis.)
    """
    o = options.check()
    if o.beam_size == 1:
        return [[h] for h in greedy_search(models, src, o.max_len_a, o.max_len_b, o.length_penalty, use_cache)]
    ensemble = Ensemble(models, use_cache)
    max_lens = max_output_lengths(src, o.max_len_a, o.max_len_b, ensemble.max_output).to(src.device)
    return beam_search_loop(ensemble, src, o.beam_size, o.length_penalty, max_lens, o.nbest)


@torch.inference_mode()
def beam_search_loop(
    ensemble: Ensemble, src: torch.Tensor, k: int, alpha: float, max_lens: torch.Tensor, nbest: int
) -> list[list[Hypothesis]]:
    """The whole batch src (B, S) through a `BeamSearch`, stepped until every sentence is done."""
    results: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    search = BeamSearch(ensemble, k, alpha, nbest)
    search.add(src, max_lens, list(range(src.size(0))))
    while search.keys:
        for i, hypotheses in search.step():
            results[i] = hypotheses
    return results


class BeamSearch:
    """The beam loop over N*k rows (a sentence's beams adjacent), any k >= 1, as a batch that new
    sentences may join between steps (`add`: a server's continuous batching) and that each
    sentence leaves as soon as it is done (`step` returns it).

    The encoder and the cross-attention keys/values run once per sentence, and a sentence's beams
    share them (see Transformer.reorder_state). Each step: the 2k best extensions per sentence
    (tensor top-k over beams x vocab); those among the first k that end (EOS or
    max length) join `Finished`, the first k non-EOS ones form the next beam. A sentence is done
    at its max length, or once it has nbest finished hypotheses and `open_bound` cannot beat the
    nbest-th of them (nothing still open could change its n-best list); it then leaves the batch
    (its state rows are dropped).
    """

    def __init__(self, ensemble: Ensemble, k: int, alpha: float, nbest: int) -> None:
        self.ensemble, self.k, self.alpha, self.nbest = ensemble, k, alpha, nbest
        self.keys: list[Any] = []  # the caller's key of each active sentence

    @torch.inference_mode()
    def add(self, src: torch.Tensor, max_lens: torch.Tensor, keys: list[Any]) -> None:
        """Sentences src (B, S) with their max output lengths (B,) join, known by `keys`. In an
        empty search each gets one row (the first step fans out to k beams); joining a running one,
        as many rows as its sentences have, beams past the first at -inf (so they fan out too)."""
        B, device = src.size(0), src.device
        if B == 0:
            return
        width = int(max_lens.max())
        finished = Finished(B, self.k, width, device)
        if not self.keys:
            self.ensemble.start(src)
            self.scores = torch.zeros(B, 1, device=device)  # (N, beams) log-probs of the open hypotheses
            self.tokens = src.new_full((B,), BOS)  # (N*beams,) last token of each row
            self.history = src.new_zeros(B, width)  # (N*beams, width) each row's tokens so far, left-aligned
            self.lengths = src.new_zeros(B)  # (N,) tokens so far of each sentence
            self.max_lens, self.finished, self.keys = max_lens, finished, list(keys)
            return
        beams = self.scores.size(1)
        self.ensemble.join(src, beams)
        scores = torch.zeros(B, beams, device=device)
        scores[:, 1:] = NEG_INF
        self.scores = torch.cat([self.scores, scores])
        self.tokens = torch.cat([self.tokens, src.new_full((B * beams,), BOS)])
        width = max(width, self.history.size(1))
        history = (self.history, src.new_zeros(B * beams, width))
        self.history = torch.cat([F.pad(h, (0, width - h.size(1))) for h in history])
        self.lengths = torch.cat([self.lengths, src.new_zeros(B)])
        self.max_lens = torch.cat([self.max_lens, max_lens])
        self.finished.join(finished)
        self.keys += keys

    @torch.inference_mode()
    def step(self) -> list[tuple[Any, list[Hypothesis]]]:
        """One token more for every active sentence; the sentences done leave: (key, their nbest
        hypotheses best first) for each."""
        k, (N, beams), device = self.k, self.scores.shape, self.scores.device
        length = self.lengths + 1  # (N,) tokens after this step
        top = self.ensemble.top(self.tokens, 2 * k)
        cand_scores, cand_beams, cand_tokens = top_candidates(self.scores, *top, 2 * k)
        parents = cand_beams + beams * torch.arange(N, device=device)[:, None]  # (N, 2k) parent rows
        finish, go_on = split_candidates(cand_scores, cand_tokens, k, self.max_lens <= length)
        if finish.any():
            ends = self.history[parents[:, :k]]  # (N, k, width)
            ends.scatter_(2, self.lengths.view(N, 1, 1).expand(N, k, 1), cand_tokens[:, :k, None])
            ended = normalize(cand_scores[:, :k], length[:, None], self.alpha).masked_fill(~finish, NEG_INF)
            self.finished.add(ended, cand_scores[:, :k], length, ends)
        scores = cand_scores.gather(1, go_on)  # (N, k)
        rows, tokens = parents.gather(1, go_on).view(-1), cand_tokens.gather(1, go_on).view(-1)
        history = self.history[rows]  # (N*k, width)
        history.scatter_(1, self.lengths.repeat_interleave(k)[:, None], tokens[:, None])
        nth = self.finished.nth(self.nbest)  # (N,) -inf while fewer than nbest have finished
        beaten = (nth > NEG_INF) & (open_bound(scores, length, self.max_lens, self.alpha) <= nth)
        done = (self.max_lens <= length) | beaten
        out, keep = [], None
        if done.any():
            for i in done.nonzero().squeeze(1).tolist():
                out.append((self.keys[i], self.finished.hypotheses(i, self.nbest)))
            keep = (~done).nonzero().squeeze(1)  # (N',) the sentences that go on
            self.keys = [self.keys[i] for i in keep.tolist()]
            if not self.keys:
                return out
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)  # (N'*k,)
            scores, length, self.max_lens = scores[keep], length[keep], self.max_lens[keep]
            self.finished.select(keep)
            rows, tokens, history = rows[keep_rows], tokens[keep_rows], history[keep_rows]
        self.ensemble.reorder(rows, keep if keep is not None else torch.arange(N, device=device))
        self.scores, self.tokens, self.history, self.lengths = scores, tokens, history, length
        return out
