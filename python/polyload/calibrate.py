"""Measure the cost model on your own GPU: ``cost: {a, b, c}`` for balancing.

Balancing deals work by a cost model, ``a * tokens + b * sum(document_length^2) + c`` per
micro-batch (SPEC section 5).  The presets count FLOPs; a GPU runs attention kernels at a
lower fraction of peak than the GEMMs, so the measured ``b / a`` is larger (about twice on
an H200 for a Llama-3.2-1B-shaped layer).  Calibrate before turning balancing on:

    import polyload.calibrate as cal

    def step(batch):                      # forward + loss of YOUR model on one micro-batch
        out = model(**polyload.hf.causal_lm_batch(batch))
        return out.loss

    rows = cal.measure(step, cal.micro_batches(seq_length=8192), vocab_size=32000,
                       device="cuda")        # the batches on the model's device
    fit = cal.fit(rows)                   # {"a", "b", "c", "r2", "max_relative_error"}
    print(cal.cost_config(fit))           # paste into the polyload config

:func:`micro_batches` builds synthetic THD micro-batches (polyload batch dicts: one
packed row, ``cu_seqlens`` over its documents) of equal documents (one of ``T`` tokens, two
of ``T/2``, ... down to ``min_length``) and of one long document with short ones, which
spread ``sum(l^2)`` at a fixed token count so that ``b`` is told apart from ``a``.
:func:`measure` times forward+backward of ``step`` (the model, or one layer of it: the
fit's ratios are what balancing uses, and a layer's ``a, b, c`` times the layer count is
the model's, plus the LM head's linear term) with CUDA events on a GPU, wall time on a CPU;
best of ``repeats`` after ``warmup`` calls.  :func:`fit` is ``pl_cost_fit`` (least squares,
the C library's).  ``python -m polyload.calibrate`` measures a small built-in decoder
layer, to try the helper out.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from . import _core

__all__ = ["micro_batches", "measure", "fit", "cost_config"]


def _batch(lengths: Sequence[int], vocab_size: int, device=None) -> Dict[str, Any]:
    """A polyload micro-batch dict of one packed row holding documents of `lengths`."""
    import torch

    T = int(sum(lengths))
    g = torch.Generator().manual_seed(T * 31 + len(lengths))
    ids = torch.randint(0, vocab_size, (1, T), generator=g)
    labels = torch.roll(ids, -1, dims=1)
    mask = torch.ones(1, T, dtype=torch.float32)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + int(n))
        labels[0, cu[-1] - 1] = -100  # a document's last token has no label
        mask[0, cu[-1] - 1] = 0.0
    pos = torch.cat([torch.arange(int(n)) for n in lengths]).reshape(1, T)
    b = {"input_ids": ids, "labels": labels, "loss_mask": mask, "position_ids": pos,
         "cu_seqlens": torch.tensor(cu, dtype=torch.int32), "max_seqlen": int(max(lengths)),
         "step_loss_tokens": int(mask.sum()), "rank_loss_tokens": int(mask.sum())}
    if device is not None:
        b = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in b.items()}
    return b


def micro_batches(seq_length: int, min_length: int = 256,
                  tokens: Optional[Sequence[int]] = None) -> List[List[int]]:
    """Document lengths of the synthetic micro-batches, one list per micro-batch.

    For each token count ``T`` in ``tokens`` (default ``seq_length`` and ``seq_length / 4``):
    equal documents ``T / 2^k`` down to ``min_length``, and one document of ``T / 2``,
    ``T / 4`` or ``3T / 4`` with the rest in ``min_length`` pieces.
    """
    tokens = list(tokens) if tokens else [seq_length, max(seq_length // 4, min_length)]
    out: List[List[int]] = []
    for T in tokens:
        d = T
        while d >= min_length:
            out.append([d] * (T // d) + ([T % d] if T % d else []))
            d //= 2
        for frac in (0.75, 0.5, 0.25):
            long = int(T * frac)
            rest = T - long
            if long >= min_length and rest >= min_length:
                out.append([long] + [min_length] * (rest // min_length)
                           + ([rest % min_length] if rest % min_length else []))
    return out


def measure(step: Callable[[Mapping[str, Any]], Any], shapes: Iterable[Sequence[int]],
            vocab_size: int = 32000, device=None, repeats: int = 3,
            warmup: int = 2) -> List[Dict[str, float]]:
    """Time forward+backward of ``step(batch)`` (returns a scalar loss) per micro-batch.

    Returns rows ``{"tokens", "sum_sq", "seconds"}`` (best of ``repeats``).  With a CUDA
    ``device`` the batches are built there and the time is CUDA events around the call and
    ``backward()``; otherwise wall time, after waiting for the GPU when CUDA is in use (a
    ``step`` that moves the batch to the GPU itself would else be timed by its kernel
    launches only).
    """
    import torch

    dev = torch.device(device) if device is not None else None
    cuda = dev is not None and dev.type == "cuda"

    def gpu_sync():
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    rows = []
    for lengths in shapes:
        lengths = [int(n) for n in lengths if int(n) > 0]
        b = _batch(lengths, vocab_size, dev)
        best = float("inf")
        for it in range(warmup + repeats):
            if cuda:
                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0.record()
            else:
                gpu_sync()
                s = time.perf_counter()
            loss = step(b)
            loss.backward()
            if cuda:
                t1.record()
                torch.cuda.synchronize(dev)
                secs = t0.elapsed_time(t1) / 1000.0
            else:
                gpu_sync()
                secs = time.perf_counter() - s
            if it >= warmup:
                best = min(best, secs)
        rows.append({"tokens": float(sum(lengths)),
                     "sum_sq": float(sum(n * n for n in lengths)), "seconds": best})
    return rows


def fit(rows: Sequence[Mapping[str, float]]) -> Dict[str, float]:
    """``a, b, c`` by least squares (``pl_cost_fit``), ``r2`` and the worst row's error."""
    t = [r["tokens"] for r in rows]
    s = [r["sum_sq"] for r in rows]
    y = [r["seconds"] for r in rows]
    f = dict(_core.cost_fit(t, s, y))
    worst = max(abs(f["a"] * ti + f["b"] * si + f["c"] - yi) / yi
                for ti, si, yi in zip(t, s, y) if yi > 0)
    f["max_relative_error"] = worst
    return f


def cost_config(f: Mapping[str, float], layers: int = 1, head_a: float = 0.0,
                head_c: float = 0.0) -> str:
    """The ``cost:`` YAML of a fit (of one layer times ``layers``, plus a linear head)."""
    a = f["a"] * layers + head_a
    b = f["b"] * layers
    c = f["c"] * layers + head_c
    return (f"cost: {{a: {a:.6e}, b: {b:.6e}, c: {c:.6e}}}  "
            f"# b/a = {b / a:.3g}; fit r2 {f['r2']:.4f}, worst row "
            f"{100 * f.get('max_relative_error', 0.0):.1f} % off")


def _demo_layer(d_model: int, heads: int, device):
    """A pre-norm decoder layer with attention within each document (SDPA, block mask)."""
    import torch
    import torch.nn.functional as F

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(1024, d_model)
            self.qkv = torch.nn.Linear(d_model, 3 * d_model)
            self.proj = torch.nn.Linear(d_model, d_model)
            self.fc = torch.nn.Linear(d_model, 4 * d_model)
            self.out = torch.nn.Linear(4 * d_model, d_model)

        def forward(self, b):
            ids = b["input_ids"].reshape(-1) % 1024
            T = ids.numel()
            x = self.emb(ids)
            cu = b["cu_seqlens"].long()
            seg = torch.repeat_interleave(torch.arange(len(cu) - 1, device=x.device), cu.diff())
            mask = (seg[:, None] == seg[None, :]) & torch.ones(T, T, dtype=torch.bool,
                                                               device=x.device).tril()
            q, k, v = self.qkv(F.layer_norm(x, (d_model,))).view(T, 3, heads, -1).unbind(1)
            a = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                               v.transpose(0, 1), attn_mask=mask)
            x = x + self.proj(a.transpose(0, 1).reshape(T, d_model))
            x = x + self.out(F.gelu(self.fc(F.layer_norm(x, (d_model,)))))
            return x.float().pow(2).mean()

    return Layer().to(device)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Measure a built-in decoder layer and print "
                                 "the cost config (a demonstration of polyload.calibrate)")
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--min-length", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=1, help="the model's layer count")
    ap.add_argument("--device", default=None)
    a = ap.parse_args(argv)
    import torch

    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    layer = _demo_layer(a.d_model, a.heads, dev)
    rows = measure(layer, micro_batches(a.seq_length, a.min_length), device=dev)
    f = fit(rows)
    for r in rows:
        print(f"tokens {int(r['tokens']):7d}  sum_sq {r['sum_sq']:.4g}  {1000 * r['seconds']:.3f} ms")
    print(cost_config(f, layers=a.layers))


if __name__ == "__main__":
    main()
