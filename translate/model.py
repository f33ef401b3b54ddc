"""The Transformer encoder-decoder of "Attention Is All You Need".

Shapes: B batch, S source length, T target length, D d_model, H heads, K = D / H.
Token ids: PAD=0, UNK=1, BOS=2, EOS=3 (see tokenizer.py). A source is pieces + EOS; the
decoder reads BOS + pieces and predicts pieces + EOS (teacher forcing).

Two ways through the decoder:
- `forward(src, tgt_in)`: the whole target at once (training, scoring).
- `encode(src)` once, then `decode_step(tokens, state)` one token at a time with a cache of
  each layer's self-attention keys/values and the cross-attention keys/values of the
  source, computed once per sentence (search.py). `reorder_state` follows the beams.

About 560 lines: the layers and the incremental-decoding state they carry between steps
(LayerCache, Rows, DecoderState) read together, as the decoder's step is written against them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from translate.config import ModelConfig
from translate.tokenizer import PAD


def sinusoidal_positions(n_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...). Returns (n_positions, D)."""
    position = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)  # (P, 1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(n_positions, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return pe


class MultiHeadAttention(nn.Module):
    """Multi-head attention with the seed's names: W_q, W_k, W_v, W_o, scaled by 1/sqrt(d_k)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.dropout = dropout
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)
        self.W_qkv: nn.Module | None = None  # W_q, W_k, W_v as one layer, for decoding (fuse_qkv)

    def fuse_qkv(self) -> None:
        """Add W_qkv, the query, key and value projections as one (D, 3D) layer: one product per
        decoding step instead of three, the same results. For inference (inference.pack_linears);
        training goes on updating W_q, W_k and W_v."""
        d_model = self.W_q.in_features
        self.W_qkv = nn.Linear(d_model, 3 * d_model)
        with torch.no_grad():
            self.W_qkv.weight.copy_(torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight]))
            self.W_qkv.bias.copy_(torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias]))

    def step_projections(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A decoding step's query (R, 1, D) and new keys and values side by side (R, 1, 2D) of h (R, 1, D)."""
        if self.W_qkv is not None:
            qkv = self.W_qkv(h)  # (R, 1, 3D)
            D = h.size(-1)
            return qkv[..., :D], qkv[..., D:]
        return self.W_q(h), torch.cat([self.W_k(h), self.W_v(h)], dim=-1)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, H, L, K)"""
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_k).transpose(1, 2)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        project: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (B, H, Lq, K), k/v (B, H, Lk, K), mask broadcastable to (B, H, Lq, Lk), True = may attend.

        Returns the output (B, Lq, D), projected by W_o unless project=False, and, if asked, the
        weights (B, H, Lq, Lk).
        """
        B, _, Lq, _ = q.shape
        p = self.dropout if self.training else 0.0
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, Lq, Lk)
            if is_causal:
                Lk = k.size(2)
                future = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).triu(Lk - Lq + 1)
                scores = scores.masked_fill(future, float("-inf"))
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            out = F.dropout(weights, p, self.training) @ v  # (B, H, Lq, K)
        else:
            weights = None
            if q.dtype == torch.bfloat16 and q.device.type == "cpu" and q.requires_grad:
                # torch's CPU flash attention is slower in bf16 than in fp32, backward above all
                with torch.autocast("cpu", enabled=False):
                    out = F.scaled_dot_product_attention(
                        q.float(), k.float(), v.float(), attn_mask=mask, dropout_p=p, is_causal=is_causal
                    ).to(q.dtype)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal)
        out = out.transpose(1, 2).reshape(B, Lq, self.n_heads * self.d_k)  # (B, Lq, D)
        return (self.W_o(out) if project else out), weights

    def forward(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, Lq, D) attends over key_value (B, Lk, D)."""
        q = self.split_heads(self.W_q(query))
        k = self.split_heads(self.W_k(key_value))
        v = self.split_heads(self.W_v(key_value))
        return self.attend(q, k, v, mask, is_causal, need_weights)


class _ByteDropout(torch.autograd.Function):
    """x * mask * scale, where mask keeps an element when its random byte is >= threshold."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, threshold: int, scale: float) -> torch.Tensor:
        n = x.numel()
        words = torch.randint(-(2**63), 2**63 - 1, ((n + 7) // 8,), dtype=torch.int64, device=x.device)
        keep = words.view(torch.uint8)[:n].view(x.shape) >= threshold  # one random byte per element
        mask = keep.to(x.dtype).mul_(scale)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask, None, None


class Dropout(nn.Module):
    """Inverted dropout. On CPU it draws one random byte per element, eight at a time, about twice
    as fast as torch's own (bernoulli is slow there); p is rounded to a multiple of 1/256, at most
    255/256. Elsewhere it is F.dropout."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.threshold = min(round(p * 256), 255)  # 256 would drop everything (and divide by zero)
        self.scale = 256 / (256 - self.threshold)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.threshold == 0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, True)
        return _ByteDropout.apply(x, self.threshold, self.scale)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(F.relu(self.linear1(x))))


class Sublayer(nn.Module):
    """Residual connection around a sublayer, with post-norm (Add & Norm) or pre-norm."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def inp(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) if self.pre_norm else x

    def out(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(y)
        return x if self.pre_norm else self.norm(x)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.sub_attn = Sublayer(cfg.d_model, cfg.dropout, pre)
        self.sub_ffn = Sublayer(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor, need_weights: bool = False):
        """x (B, S, D), src_mask (B, 1, 1, S) True = real token."""
        h = self.sub_attn.inp(x)
        y, w = self.self_attn(h, h, src_mask, need_weights=need_weights)
        x = self.sub_attn.out(x, y)
        x = self.sub_ffn.out(x, self.ffn(self.sub_ffn.inp(x)))
        return x, w


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.sub_self = Sublayer(cfg.d_model, cfg.dropout, pre)
        self.sub_cross = Sublayer(cfg.d_model, cfg.dropout, pre)
        self.sub_ffn = Sublayer(cfg.d_model, cfg.dropout, pre)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        need_weights: bool = False,
    ):
        """Whole-target pass. x (B, T, D), memory (B, S, D), src_mask (B, 1, 1, S)."""
        h = self.sub_self.inp(x)
        y, w_self = self.self_attn(h, h, None, is_causal=True, need_weights=need_weights)
        x = self.sub_self.out(x, y)
        y, w_cross = self.cross_attn(self.sub_cross.inp(x), memory, src_mask, need_weights=need_weights)
        x = self.sub_cross.out(x, y)
        x = self.sub_ffn.out(x, self.ffn(self.sub_ffn.inp(x)))
        return x, w_self, w_cross

    def step(
        self, x: torch.Tensor, cache: LayerCache, src_mask: torch.Tensor, groups: list[Rows], layer: int, masks: list
    ) -> torch.Tensor:
        """The next position of every row. x (R, 1, D), R = N sentences x beams (a sentence's rows
        adjacent), src_mask (N, 1, 1, S). The rows come in `groups` (consecutive, see Rows), each with
        its own self-attention keys/values, which the new ones join, and its mask of the positions
        each row may see (None: all); the source's keys/values are read per sentence."""
        R, N = x.size(0), src_mask.size(0)
        attn, cross = self.self_attn, self.cross_attn
        h = self.sub_self.inp(x)
        D = x.size(-1)
        q, kv_new = attn.step_projections(h)
        q, kv_new = attn.split_heads(q), kv_new.view(R, 2, D)  # (R, H, 1, K), (R, 2, D) keys and values
        parts, r = [], 0
        for group, mask in zip(groups, masks, strict=True):
            rows = slice(r, r + group.rows)
            t = group.step
            kv = group.append(layer, kv_new[rows])  # (t+1, 2, rows, D)
            k, v = (kv[:, i].view(t + 1, group.rows, attn.n_heads, attn.d_k).permute(1, 2, 0, 3) for i in (0, 1))
            parts.append(attn.attend(q[rows], k, v, mask, project=False)[0])  # every cached position of its sentence
            r += group.rows
        x = self.sub_self.out(x, attn.W_o(parts[0] if len(parts) == 1 else torch.cat(parts)))
        q = cross.W_q(self.sub_cross.inp(x)).view(N, R // N, cross.n_heads, cross.d_k)  # (N, beams, H, K)
        y, _ = cross.attend(q.transpose(1, 2), cache.mk, cache.mv, src_mask)  # (N, beams, D): one source per sentence
        x = self.sub_cross.out(x, y.view(R, 1, -1))
        return self.sub_ffn.out(x, self.ffn(self.sub_ffn.inp(x)))


@dataclass
class LayerCache:
    """One decoder layer's cross-attention keys/values of the source, computed once, one row per sentence."""

    mk: torch.Tensor  # (N, H, S, K) keys
    mv: torch.Tensor  # (N, H, S, K) values

    def select(self, keep: torch.Tensor | None, width: int | None = None) -> LayerCache:
        """The sentences `keep` (None: all), their sources cut to `width` positions (None: all)."""
        mk, mv = (self.mk, self.mv) if width is None else (self.mk[:, :, :width], self.mv[:, :, :width])
        if keep is None:
            return LayerCache(mk, mv)
        return LayerCache(mk.index_select(0, keep), mv.index_select(0, keep))

    def join(self, new: LayerCache) -> LayerCache:
        """These sentences followed by a fresh cache's, the sources padded to the longer one."""
        S = max(self.mk.size(2), new.mk.size(2))
        mk = torch.cat([F.pad(m, (0, 0, 0, S - m.size(2))) for m in (self.mk, new.mk)])
        mv = torch.cat([F.pad(m, (0, 0, 0, S - m.size(2))) for m in (self.mv, new.mv)])
        return LayerCache(mk, mv)


GROUP_MERGE_WASTE = 40  # a group joins the one before when that pads fewer row positions (5 beams x 8 steps)
MAX_GROUPS = 8  # past this many groups, the two whose merging pads the fewest positions merge


@dataclass
class Rows:
    """A group of consecutive rows whose sentences joined a search at about the same step, with
    every decoder layer's self-attention keys/values of the positions decoded since the oldest of
    them joined: kept time-major in a buffer per layer that grows by doubling, so a step writes
    one slice and a reorder is one index_select. Rows of a sentence that joined later are padded
    before their first position (masked). A search that sentences join while it runs (a server's
    continuous batching) keeps its rows in a few such groups, so that a sentence that has just
    joined does not attend over (and copy) the whole history of the oldest one."""

    rows: int
    kv: list[torch.Tensor | None]  # per layer (capacity, 2, rows, D) keys [:, 0] and values [:, 1]; None: none yet
    step: int = 0  # positions held
    start: torch.Tensor | None = None  # (rows,) the position at which each row's sentence joined (None: all at 0)

    def append(self, layer: int, new: torch.Tensor) -> torch.Tensor:
        """new (rows, 2, D): the keys and values of position `step` -> that layer's keys/values of
        positions 0..step: (step+1, 2, rows, D)."""
        t, kv = self.step, self.kv[layer]
        if kv is None or t == kv.size(0):
            grown = new.new_empty(max(16, 2 * t), 2, new.size(0), new.size(2))
            if t:
                grown[:t] = kv[:t]
            self.kv[layer] = kv = grown
        kv[t] = new.transpose(0, 1)
        return kv[: t + 1]

    def mask(self, device: torch.device) -> torch.Tensor | None:
        """(rows, 1, 1, step+1): the positions each row may see at the next step (None: all)."""
        if self.start is None:
            return None
        return (torch.arange(self.step + 1, device=device) >= self.start[:, None])[:, None, None]

    def select(self, index: torch.Tensor) -> Rows:
        """Rows `index` of this group; positions before every row's start are dropped."""
        start, first = None, 0
        if self.start is not None:
            start = self.start.index_select(0, index)
            first = int(start.min())
            start = None if int(start.max()) == first else start - first
        kvs: list[torch.Tensor | None] = []
        for kv in self.kv:
            if kv is not None:
                out = kv.new_empty(kv.size(0), 2, index.numel(), kv.size(3))
                torch.index_select(kv[first : self.step], 2, index, out=out[: self.step - first])
                kv = out
            kvs.append(kv)
        return Rows(index.numel(), kvs, self.step - first, start)

    def waste(self, younger: Rows) -> int:
        """The padded positions merging a younger group into this one adds."""
        return younger.rows * (self.step - younger.step)

    def merge(self, younger: Rows, device: torch.device) -> Rows:
        """This group followed by a younger one (fewer positions), padded before its first position."""
        gap = self.step - younger.step
        if gap < 0:
            raise ValueError("a group merges only into an older one")

        def starts(g: Rows) -> torch.Tensor:
            return torch.zeros(g.rows, dtype=torch.long, device=device) if g.start is None else g.start

        start = torch.cat([starts(self), starts(younger) + gap])
        kvs: list[torch.Tensor | None] = []
        for old, new in zip(self.kv, younger.kv, strict=True):
            if old is not None:
                kv = old.new_empty(old.size(0), 2, self.rows + younger.rows, old.size(3))
                kv[: self.step, :, : self.rows] = old[: self.step]
                kv[:gap, :, self.rows :] = 0  # masked, but must be finite
                if younger.step:
                    kv[gap : self.step, :, self.rows :] = new[: younger.step]
                old = kv
            kvs.append(old)
        return Rows(self.rows + younger.rows, kvs, self.step, None if not int(start.max()) else start)


def merge_groups(groups: list[Rows], device: torch.device) -> list[Rows]:
    """The groups after the youngest joined the one before it if that pads few positions
    (GROUP_MERGE_WASTE), and after merging the cheapest adjacent pairs while there are more than
    MAX_GROUPS."""
    groups = list(groups)
    if len(groups) > 1 and groups[-2].waste(groups[-1]) < GROUP_MERGE_WASTE:
        groups[-2:] = [groups[-2].merge(groups[-1], device)]
    while len(groups) > MAX_GROUPS:
        i = min(range(len(groups) - 1), key=lambda i: groups[i].waste(groups[i + 1]))
        groups[i : i + 2] = [groups[i].merge(groups[i + 1], device)]
    return groups


@dataclass
class DecoderState:
    """What incremental decoding carries between steps (see Transformer.decode_step)."""

    src_mask: torch.Tensor  # (N, 1, 1, S) True = real source token, one row per sentence
    caches: list[LayerCache]  # one per decoder layer
    groups: list[Rows]  # the rows in order, in groups of sentences that joined at about the same step

    @property
    def span(self) -> int:
        """Positions held by the oldest group."""
        return max(g.step for g in self.groups)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        D = cfg.d_model
        self.embed = nn.Embedding(vocab_size, D, padding_idx=PAD)
        self.tgt_embed = self.embed if cfg.tie_embeddings else nn.Embedding(vocab_size, D, padding_idx=PAD)
        self.register_buffer("pe", sinusoidal_positions(cfg.max_positions, D), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"
        self.enc_norm = nn.LayerNorm(D) if pre else nn.Identity()
        self.dec_norm = nn.LayerNorm(D) if pre else nn.Identity()
        self.output = nn.Linear(D, vocab_size, bias=False)
        self.dropout = Dropout(cfg.dropout)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.output.weight = self.embed.weight

    def reset_parameters(self) -> None:
        """model.init normal: weight matrices and embeddings N(0, 0.02); xavier: xavier-uniform
        matrices, embeddings N(0, d_model^-0.5). Biases 0, LayerNorm 1/0, the PAD embedding 0."""
        normal = self.cfg.init == "normal"
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, 0.02) if normal else nn.init.xavier_uniform_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
        for emb in dict.fromkeys([self.embed, self.tgt_embed]):  # in order (a set of modules is not)
            nn.init.normal_(emb.weight, mean=0.0, std=0.02 if normal else self.cfg.d_model**-0.5)
            nn.init.zeros_(emb.weight[PAD])

    # -------------------------------------------------------------------- pieces

    def embed_tokens(self, emb: nn.Embedding, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """tokens (B, L) -> (B, L, D): scaled embedding + positions offset..offset+L-1."""
        L = tokens.size(1)
        pe = self.pe
        if offset + L > pe.size(0):  # past the table: computed for this call, the buffer is left as it is
            pe = sinusoidal_positions(offset + L, self.cfg.d_model).to(pe.device)
        x = emb(tokens) * math.sqrt(self.cfg.d_model) + pe[offset : offset + L].to(emb.weight.dtype)
        return self.dropout(x)

    def encode(self, src: torch.Tensor, need_weights: bool = False, src_mask: torch.Tensor | None = None):
        """src (B, S) -> memory (B, S, D), src_mask (B, 1, 1, S) [, per-layer self-attention weights].

        src_mask: True = real token (made from src when not given), or an additive float mask (forward)."""
        if src_mask is None:
            src_mask = (src != PAD)[:, None, None, :]
        x = self.embed_tokens(self.embed, src)
        weights = []
        for layer in self.encoder:
            x, w = layer(x, src_mask, need_weights)
            weights.append(w)
        memory = self.enc_norm(x)
        return (memory, src_mask, weights) if need_weights else (memory, src_mask)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor, need_weights: bool = False):
        """Whole-target decoder pass: tgt_in (B, T) -> hidden states (B, T, D) [, weights]."""
        x = self.embed_tokens(self.tgt_embed, tgt_in)
        self_w, cross_w = [], []
        for layer in self.decoder:
            x, ws, wc = layer(x, memory, src_mask, need_weights)
            self_w.append(ws)
            cross_w.append(wc)
        x = self.dec_norm(x)
        return (x, self_w, cross_w) if need_weights else x

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher forcing. src (B, S), tgt_in (B, T) -> logits (B, T, V).

        With `keep` (N,), flat positions of (B, T), only those are projected: logits (N, V).
        On a GPU the padding mask is made additive once here, rather than converted from bool by
        each of the attention calls that use it.
        """
        src_mask = (src != PAD)[:, None, None, :]
        if src.device.type == "cuda":
            dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else self.embed.weight.dtype
            src_mask = torch.zeros(src_mask.shape, dtype=dtype, device=src.device).masked_fill_(
                ~src_mask, float("-inf")
            )
        memory, src_mask = self.encode(src, src_mask=src_mask)
        h = self.decode(tgt_in, memory, src_mask)
        if keep is not None:
            h = h.flatten(0, 1).index_select(0, keep)  # (N, D)
        return self.output(h)

    def attention(self, src: torch.Tensor, tgt_in: torch.Tensor) -> dict[str, list[torch.Tensor]]:
        """Attention weights of every layer: encoder self (B, H, S, S), decoder self (B, H, T, T),
        cross (B, H, T, S)."""
        memory, src_mask, enc_w = self.encode(src, need_weights=True)
        _, dec_w, cross_w = self.decode(tgt_in, memory, src_mask, need_weights=True)
        return {"encoder": enc_w, "decoder": dec_w, "cross": cross_w}

    # -------------------------------------------------------------------- incremental decoding

    def init_state(self, memory: torch.Tensor, src_mask: torch.Tensor) -> DecoderState:
        """One row per sentence: every decoder layer's cross-attention keys/values, computed once (N, H, S, K)."""
        caches = []
        for layer in self.decoder:
            cross = layer.cross_attn
            caches.append(LayerCache(cross.split_heads(cross.W_k(memory)), cross.split_heads(cross.W_v(memory))))
        return DecoderState(src_mask, caches, [Rows(memory.size(0), [None] * len(caches))])

    def decode_step(self, tokens: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """tokens (R,) the last output of each row -> logits (R, V) of the next token; updates state.

        R is a multiple of the state's N sentences: each sentence's rows (its beams) are adjacent.
        """
        groups = state.groups
        if len(groups) == 1 and groups[0].start is None:
            x = self.embed_tokens(self.tgt_embed, tokens[:, None], offset=groups[0].step)  # (R, 1, D)
        else:  # rows that joined later: their own positions, and only their sentence's cached ones
            position = torch.cat(
                [g.step - g.start if g.start is not None else tokens.new_full((g.rows,), g.step) for g in groups]
            )  # (R,)
            span = state.span
            pe = self.pe if span < self.pe.size(0) else sinusoidal_positions(span + 1, self.cfg.d_model)
            pe = pe.to(self.pe.device, self.tgt_embed.weight.dtype)[position, None]  # (R, 1, D)
            x = self.dropout(self.tgt_embed(tokens[:, None]) * math.sqrt(self.cfg.d_model) + pe)
        masks = [g.mask(tokens.device) for g in groups]
        for i, (layer, cache) in enumerate(zip(self.decoder, state.caches, strict=True)):
            x = layer.step(x, cache, state.src_mask, groups, i, masks)
        for g in groups:
            g.step += 1
        return self.output(self.dec_norm(x[:, 0]))

    @staticmethod
    def reorder_state(state: DecoderState, index: torch.Tensor, keep: torch.Tensor | None = None) -> DecoderState:
        """Follow the beams: row r of the new state is row index[r] of the old one.

        keep (N',) ascending: the sentences that stay (index must pick only their rows, in sentence
        order); the source's keys/values are copied only when some leave, then cut to the longest
        source left. Without keep the state has one row per sentence and index picks (reorders,
        repeats) whole sentences (one group of rows only). A group whose sentences all left is dropped.
        """
        sentences = index if keep is None else keep
        if keep is not None and keep.numel() == state.src_mask.size(0):
            sentences = None  # every sentence stays: the source's keys/values are shared, not copied
        width = None
        src_mask = state.src_mask if sentences is None else state.src_mask.index_select(0, sentences)
        if sentences is not None and keep is not None:  # sentences left: cut the sources to the longest left
            width = max(1, int(src_mask.sum(dim=-1).max()))
            width, src_mask = (None, src_mask) if width == src_mask.size(-1) else (width, src_mask[..., :width])
        caches = [c.select(sentences, width) for c in state.caches]
        if len(state.groups) == 1:
            return DecoderState(src_mask, caches, [state.groups[0].select(index)])
        if keep is None:
            raise ValueError("reordering several groups of rows needs keep (the sentences that stay)")
        # each group's sentences are consecutive: its rows' new indices are a slice of index
        beams_before = sum(g.rows for g in state.groups) // state.src_mask.size(0)
        beams = index.numel() // max(1, keep.numel())
        ends = torch.tensor([g.rows // beams_before for g in state.groups]).cumsum(0)  # each group's last sentence + 1
        kept = torch.searchsorted(keep.cpu(), ends).tolist()  # sentences kept up to each group's end
        groups, r, old, before = [], 0, 0, 0
        for group, upto in zip(state.groups, kept, strict=True):
            rows = (upto - before) * beams
            if rows:
                groups.append(group.select(index[r : r + rows] - old))
            r, old, before = r + rows, old + group.rows, upto
        return DecoderState(src_mask, caches, groups)

    @staticmethod
    def join_state(state: DecoderState, new: DecoderState, beams: int) -> DecoderState:
        """A running state followed by a fresh one's sentences (init_state, one row each), which
        get `beams` adjacent rows each and start at position 0 now (continuous batching: new
        sentences join a search under way), as a group of rows of their own or joined to the
        youngest group (merge_groups). Every sentence of `state` must have `beams` rows."""
        masks = (state.src_mask, new.src_mask)
        src_mask = masks[0].new_zeros(sum(m.size(0) for m in masks), 1, 1, max(m.size(-1) for m in masks))
        src_mask[: masks[0].size(0), ..., : masks[0].size(-1)] = masks[0]
        src_mask[masks[0].size(0) :, ..., : masks[1].size(-1)] = masks[1]
        caches = [old.join(fresh) for old, fresh in zip(state.caches, new.caches, strict=True)]
        fresh = Rows(beams * new.src_mask.size(0), [None] * len(caches))
        return DecoderState(src_mask, caches, merge_groups([*state.groups, fresh], src_mask.device))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
