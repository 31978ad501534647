"""A tiny decoder-only transformer in plain PyTorch, for the balancing figures.

Two layers, d_model 128, 4 heads, vocab 1024, pre-norm, GELU MLP (4x).  A
packed sequence (one row of the THD layout) with cu_seqlens is attended
causally within each document:

  attn="varlen"  one scaled_dot_product_attention(is_causal=True) per
                 document, which is what FlashAttention's varlen kernel
                 computes: work ~ sum(len^2), the cost model's attention term.
  attn="mask"    one scaled_dot_product_attention over the whole row with a
                 boolean block-diagonal causal mask built from cu_seqlens.
                 Correct, but a dense kernel does seq^2 work whatever the
                 documents, so its time does not follow sum(len^2).
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D, HEADS, LAYERS = 1024, 128, 4, 2


def block_causal_mask(cu_seqlens, n):
    """[n, n] bool: True where query i may attend key j (same doc, j <= i)."""
    doc = torch.zeros(n, dtype=torch.long)
    doc[cu_seqlens[1:-1]] = 1
    doc = doc.cumsum(0)
    idx = torch.arange(n)
    return (doc[:, None] == doc[None, :]) & (idx[None, :] <= idx[:, None])


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def attention(self, x, cu, attn, mask):
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, HEADS, D // HEADS).permute(1, 2, 0, 3)
        if attn == "mask":
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            outs = []
            for s, e in zip(cu[:-1], cu[1:]):
                outs.append(F.scaled_dot_product_attention(
                    q[:, s:e], k[:, s:e], v[:, s:e], is_causal=True))
            o = torch.cat(outs, dim=1)
        return self.proj(o.permute(1, 0, 2).reshape(n, D))

    def forward(self, x, cu, attn, mask):
        x = x + self.attention(self.ln1(x), cu, attn, mask)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids, cu, attn="varlen"):
        mask = block_causal_mask(torch.tensor(cu), ids.shape[0]) if attn == "mask" else None
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x, cu, attn, mask)
        return self.head(self.ln(x))


def step_time(model, doc_lengths, attn="varlen", repeat=3, gen=None, stat="median"):
    """Seconds of forward+backward of one packed row of documents: the median
    (or, stat="min", the least, the reading least disturbed by other
    processes) of `repeat` runs."""
    n = int(sum(doc_lengths))
    cu = [0]
    for l in doc_lengths:
        cu.append(cu[-1] + int(l))
    ids = torch.randint(0, VOCAB, (n,), generator=gen)
    labels = torch.randint(0, VOCAB, (n,), generator=gen)
    times = []
    for _ in range(repeat):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(ids, cu, attn), labels)
        loss.backward()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0] if stat == "min" else times[len(times) // 2]
