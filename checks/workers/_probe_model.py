"""The train probe's model, apart from the Probe that trains it: the small GPT
(embedding, causal attention, MLP, RMSNorm, a head tied to the embedding), the
memory it needs and how it is shrunk to fit, and the checksum of its bits that
the probe compares across ranks (logits and parameters). Pure functions over
the torch module passed in: what a newcomer checks against the FLOP count and
the memory arithmetic (tests/checks/test_probe_model.py) without the stages
around it. Standard library and torch (passed in) only; imported as
``_probe_model`` from beside the workers.
"""

from __future__ import annotations


def probe_bytes(batch: int, layers: int, d: int, seq: int, vocab: int) -> int:
    """Memory the probe needs: activations kept for backward, 56 x seq x d bytes per
    layer and sequence (Korthikanti et al. 2022 count 34 for pure bf16; the fp32
    residual stream and norms here measured 1.5x that), the logits at the
    loss's peak (16 bytes a vocab entry: bf16, the fp32 copy and its gradient),
    and 16 bytes a parameter (fp32 weights and gradients, AdamW's two moments)."""
    params = 12 * layers * d * d + vocab * d
    return batch * seq * (56 * d * layers + 16 * vocab) + 16 * params


def fit_model(free: int, batch: int, layers: int, d: int, seq: int, vocab: int) -> tuple[int, int]:
    """Halve the batch, then the layers, until the probe fits in half of ``free``; (1, 1) at least."""
    while (batch > 1 or layers > 1) and probe_bytes(batch, layers, d, seq, vocab) > free / 2:
        if batch > 1:
            batch //= 2
        else:
            layers //= 2
    return batch, layers


def bits_checksum(torch, tensors, sync=lambda: None) -> int:
    """A sum of every value's bit pattern (as int32 words), mod 2^61: one flipped bit anywhere changes it.
    ``sync`` waits for the sums with a deadline before item() reads them."""
    sums = []
    for x in tensors:
        flat = x.detach().float().contiguous().view(-1).view(torch.int32).to(torch.int64)
        weights = torch.arange(flat.numel(), device=flat.device, dtype=torch.int64) % 1000003 + 1  # never 0: every position counts
        sums.append((flat * weights).sum())
    sync()
    total = 0
    for s in sums:
        total = (total + int(s.item())) % (2**61 - 1)
    return total


def gpt(torch, vocab: int, d: int, heads: int, layers: int, seq: int):
    nn, F = torch.nn, torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.up = nn.Linear(d, 4 * d, bias=False)
            self.down = nn.Linear(4 * d, d, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.n2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's: logits start near uniform, loss near ln(vocab)
            self.pos = nn.Parameter(torch.zeros(seq, d))
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm()

        def forward(self, idx):
            x = self.embed(idx) + self.pos[: idx.size(1)]
            for block in self.blocks:
                x = block(x)
            return self.norm(x) @ self.embed.weight.t()  # the head tied to the embedding

    return GPT()
