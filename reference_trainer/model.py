"""A small decoder-only transformer (Llama-shaped), with an optional mixture-of-experts FFN.

Read top to bottom: config, rotary embedding, attention, dense FFN, MoE FFN, block, model.

Shapes follow one convention: `x` is (batch, seq, dim). Layers live in a `ModuleDict` keyed
"0".."n-1" so that pipeline parallelism can delete the layers a stage does not own and every
remaining parameter keeps its name (and so its seed-derived initial value).

Every view that splits `dim` into heads uses -1 for the head count: under tensor parallelism
a rank holds only its heads, and the same code then works on the local slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelArgs:
    vocab_size: int = 128
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    seq_len: int = 32
    ffn_mult: int = 2  # hidden size of the FFN (and of each expert) = ffn_mult * dim
    n_experts: int = 0  # 0: dense FFN in every layer; > 0: every layer's FFN is an MoE
    top_k: int = 2  # experts per token (MoE only)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def validate(self) -> None:
        """Raise ValueError with one readable line if the shape does not add up."""
        if self.dim % self.n_heads:
            raise ValueError(f"--dim {self.dim} is not divisible by --heads {self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError("head size (--dim / --heads) must be even for rotary embeddings")
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"--top-k {self.top_k} must be in 1..--experts ({self.n_experts})")
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "seq_len", "ffn_mult"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


# --- rotary position embedding ------------------------------------------------------------
# RoPE instead of a learned position table: it acts inside attention on whole sequences, so
# it needs no change under sequence parallelism (where a rank holds a slice of the sequence
# between attention blocks) and no parameters that data parallelism would have to sync.


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len).float(), freqs)  # (seq, head_dim / 2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x: (batch, seq, heads, head_dim) by the position angle."""
    seq = x.shape[1]
    cos, sin = cos[:seq, None, :], sin[:seq, None, :]
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return out.flatten(-2)


# --- layers ---------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = apply_rope(self.wq(x).view(b, s, -1, self.head_dim), cos, sin)
        k = apply_rope(self.wk(x).view(b, s, -1, self.head_dim), cos, sin)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        # SDPA wants (batch, heads, seq, head_dim).
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        hidden = args.ffn_mult * args.dim
        self.w1 = nn.Linear(args.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class GroupedExperts(nn.Module):
    """`n` SwiGLU experts stored as stacked weights (expert, in, out).

    Stacked so that expert parallelism can keep a contiguous slice of experts by slicing
    dim 0 (see parallel/expert_parallel.py), and so every expert's weights stay in the
    autograd graph even in a step where it receives no token (an empty matmul still yields
    a zero gradient, which keeps DDP from waiting for a gradient that never comes).
    """

    def __init__(self, n: int, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n, dim, hidden))
        self.w2 = nn.Parameter(torch.empty(n, hidden, dim))
        self.w3 = nn.Parameter(torch.empty(n, dim, hidden))
        for w, fan_in in ((self.w1, dim), (self.w2, hidden), (self.w3, dim)):
            nn.init.uniform_(w, -(fan_in**-0.5), fan_in**-0.5)

    def forward(self, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """tokens: (sum(counts), dim), grouped by expert; counts[e] rows go to local expert e."""
        outs = []
        for e, chunk in enumerate(torch.split(tokens, counts)):
            h = F.silu(chunk @ self.w1[e]) * (chunk @ self.w3[e])
            outs.append(h @ self.w2[e])
        return torch.cat(outs)


class MoE(nn.Module):
    """Top-k routed mixture of experts, without capacity limits (no token is dropped).

    No token dropping makes the result independent of how experts are placed on ranks, which
    is what lets the expert-parallel run match the single-process run loss for loss.
    """

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_experts, self.top_k = args.n_experts, args.top_k
        self.router = nn.Linear(args.dim, args.n_experts, bias=False)
        self.experts = GroupedExperts(args.n_experts, args.dim, args.ffn_mult * args.dim)
        # Set by expert parallelism: a callable (tokens, counts_per_global_expert) -> outputs
        # that ships tokens to the ranks owning their experts and back. None: all local.
        self.dispatcher = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        tokens = x.reshape(-1, d)
        scores = self.router(tokens).softmax(dim=-1)
        top_scores, top_experts = scores.topk(self.top_k, dim=-1)  # (tokens, k)
        # One row per (token, chosen expert), sorted by expert so each expert gets a slice.
        flat_experts = top_experts.reshape(-1)
        order = torch.argsort(flat_experts, stable=True)
        token_of_row = order // self.top_k
        counts = torch.bincount(flat_experts, minlength=self.n_experts)
        routed = tokens[token_of_row]
        if self.dispatcher is None:
            # .tolist() is a host sync on GPU; fine for a reference model.
            out = self.experts(routed, counts.tolist())
        else:
            out = self.dispatcher(routed, counts)
        out = out * top_scores.reshape(-1)[order, None]
        return torch.zeros_like(tokens).index_add(0, token_of_row, out).view(b, s, d)


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = MoE(args) if args.n_experts else FeedForward(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """tokens (batch, seq) -> logits (batch, seq, vocab).

    Under pipeline parallelism a stage may lack `tok_embeddings` (then its input is the
    previous stage's hidden state) or `norm`/`output` (then it returns the hidden state).
    """

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        cos, sin = rope_tables(args.dim // args.n_heads, args.seq_len, args.rope_theta)
        # Non-persistent buffers: constants, rebuilt from args, never checkpointed or synced.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def build_model(args: ModelArgs, seed: int) -> Transformer:
    """The full model with weights that depend on `seed` only, identical on every rank.

    Every rank builds the whole model and then drops or slices what it does not own, so a
    parallel run starts from exactly the single-process weights. It costs the full model's
    memory for a moment on each rank, which is nothing at this size.
    """
    args.validate()
    torch.manual_seed(seed)
    return Transformer(args)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss; the pipeline schedule calls it once per microbatch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
