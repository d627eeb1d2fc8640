"""Deterministic training data, generated on the fly: nothing is downloaded or read from disk.

Sequences are samples of a fixed random Markov chain over the vocabulary (a bigram
"language"). The chain is peaked, so the model has something to learn and the loss falls
visibly within a few dozen steps, from about ln(vocab) towards the chain's entropy.

Batch `step` is a pure function of (seed, step): every rank can regenerate the global batch
and keep its own rows, and a single-process run sees exactly the same tokens. Generating
the whole global batch on every rank is wasteful in general; here it costs microseconds.
"""

from __future__ import annotations

import torch


class MarkovData:
    def __init__(self, vocab_size: int, seq_len: int, seed: int, sharpness: float = 4.0):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(vocab_size, vocab_size, generator=g) * sharpness
        self.transitions = logits.softmax(dim=-1)  # row i: distribution of the next token

    def global_batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), both (batch_size, seq_len) int64; targets are inputs shifted by one."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        tokens = torch.empty(batch_size, self.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.vocab_size, (batch_size,), generator=g)
        for t in range(self.seq_len):
            probs = self.transitions[tokens[:, t]]
            tokens[:, t + 1] = torch.multinomial(probs, 1, generator=g).squeeze(1)
        return tokens[:, :-1], tokens[:, 1:]

    def local_batch(
        self, step: int, batch_size: int, dp_rank: int, dp_degree: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This data-parallel rank's contiguous rows of the global batch."""
        inputs, targets = self.global_batch(step, batch_size)
        rows = batch_size // dp_degree
        sl = slice(dp_rank * rows, (dp_rank + 1) * rows)
        return inputs[sl].contiguous(), targets[sl].contiguous()
