#!/usr/bin/env python3
"""Train a small GPT on CPU on the demo corpus, fed by polyload.Loader.

Plain PyTorch, no training framework.  The model is a pre-LayerNorm decoder (rotary
positions from the batch's ``position_ids``, tied embeddings, GELU MLP); attention stays
inside each packed document: a block-diagonal causal mask built from ``cu_seqlens``, passed
to ``torch.nn.functional.scaled_dot_product_attention`` as a boolean mask.  (flex_attention
would avoid the [S, S] mask, but torch 2.13's CPU build has no flex_attention backward.)
The loss is the cross-entropy on ``labels`` (``ignore_index=-100``; ``loss_mask`` marks the
same tokens), averaged over the loss tokens of the whole step, all ranks together.

One process:
    .venv/bin/python examples/train_gpt.py --steps 20
Two data-parallel ranks (gloo; polyload.Loader takes its rank from torch.distributed):
    OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 examples/train_gpt.py --steps 20
Checkpoint and exact resume:
    .venv/bin/python examples/train_gpt.py --steps 10 --save ck.pt
    .venv/bin/python examples/train_gpt.py --steps 20 --resume ck.pt

Data: ``--config`` is a polyload config (default examples/train_gpt.yaml); the script sets
``topology.dp`` to the number of processes (WORLD_SIZE, 1 without torchrun: pure data
parallelism) and ``train_steps`` to ``--steps``.  Each step reads
``global_batch_size / (dp * micro_batch_size)`` micro-batches per rank, accumulates
gradients over them and all-reduces the gradients (sum over ranks, then divided by the
step's loss tokens), so one step sees the same 16 sequences whatever dp is.

``--steps N`` is the absolute step to stop at: a run resumed from step k trains steps
k..N-1.  ``--save`` writes model, optimizer, RNG and ``loader.state_dict()`` at the end
(rank 0 writes; the loader state is the same on every rank); ``--resume`` restores all four,
so the batches and the losses continue exactly as in an uninterrupted run.
``--seed`` seeds torch (model initialization); the data order is the config's ``seed``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import yaml

import polyload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens")


# --------------------------------------------------------------------------- model


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, base: float = 10000.0):
    """cos, sin of rotary embeddings for ``position_ids`` [B, S]: each [B, 1, S, head_dim/2]."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = position_ids.to(torch.float32)[..., None] * inv_freq  # [B, S, head_dim/2]
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of the last dimension of x [B, H, S, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def document_mask(cu_seqlens: torch.Tensor, rows: int, seq: int) -> torch.Tensor:
    """Boolean attention mask [rows, 1, seq, seq]: token i attends to j iff j <= i and both
    lie in the same segment of ``cu_seqlens`` (boundaries over the flattened rows * seq
    tokens, SPEC section 3).  A row's trailing padding is a segment of its own."""
    n = rows * seq
    starts = torch.zeros(n + 1, dtype=torch.int32)
    starts[cu_seqlens.long()] = 1  # 1 where a segment starts (and at n)
    segment = torch.cumsum(starts[:n], 0).view(rows, seq)
    same = segment[:, :, None] == segment[:, None, :]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    return (same & causal)[:, None]


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x, cos, sin, mask):
        B, S, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, hd]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(B, S, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int):
        super().__init__()
        assert d_model % n_heads == 0 and (d_model // n_heads) % 2 == 0
        self.head_dim = d_model // n_heads
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, input_ids, position_ids, cu_seqlens):
        """Logits [B, S, vocab] for one micro-batch (SPEC section 3 fields)."""
        B, S = input_ids.shape
        cos, sin = rope_cos_sin(position_ids, self.head_dim)
        mask = document_mask(cu_seqlens, B, S)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, cos, sin, mask)
        return F.linear(self.ln_f(x), self.embed.weight)  # tied output embedding


# ---------------------------------------------------------------------- training


def batch_sha256(batch) -> str:
    """sha256 of every field of a micro-batch (bytes of each tensor, then max_seqlen)."""
    h = hashlib.sha256()
    for name in BATCH_FIELDS:
        h.update(name.encode())
        h.update(batch[name].numpy().tobytes())
    h.update(str(batch["max_seqlen"]).encode())
    return h.hexdigest()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--config", default=os.path.join(ROOT, "examples", "train_gpt.yaml"),
                    help="polyload config (YAML; default: %(default)s)")
    ap.add_argument("--steps", type=int, default=None,
                    help="stop at this (absolute) step; default: the config's train_steps")
    ap.add_argument("--save", metavar="PATH", help="write a checkpoint here at the end")
    ap.add_argument("--resume", metavar="PATH", help="continue from this checkpoint")
    ap.add_argument("--log-batches", metavar="FILE",
                    help="append one JSON line per micro-batch: step, rank, dp_rank, "
                    "micro_batch, sha256 of its tensors.  With several processes each rank "
                    "writes FILE.rank<R> (or FILE with {rank} replaced)")
    ap.add_argument("--metrics", metavar="FILE",
                    help="append one JSON line per step (rank 0): step, loss, tokens, tokens_per_s")
    ap.add_argument("--seed", type=int, default=0, help="torch seed (model initialization)")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "data", "tokenizer.json"),
                    help="tokenizer.json whose vocabulary size sizes the model (default: %(default)s)")
    ap.add_argument("--vocab-size", type=int, help="use this instead of reading --tokenizer")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=10, help="linear warm-up steps, then constant")
    ap.add_argument("--clip", type=float, default=1.0, help="gradient norm clip")
    ap.add_argument("--log-every", type=int, default=1)
    return ap.parse_args(argv)


def vocab_size_of(args) -> int:
    if args.vocab_size:
        return args.vocab_size
    from tokenizers import Tokenizer

    return Tokenizer.from_file(args.tokenizer).get_vocab_size()


def main(argv=None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(args.seed)

    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    topo = cfg.setdefault("topology", {})
    if any(topo.get(k, 1) != 1 for k in ("pp", "cp", "tp")):
        raise SystemExit("train_gpt.py does data parallelism only: pp, cp and tp must be 1")
    topo["dp"] = world  # one DP rank per process
    steps = args.steps if args.steps is not None else int(cfg.get("train_steps", 1000))
    cfg["train_steps"] = steps
    if cfg.get("dtype", "int64") != "int64":
        raise SystemExit("train_gpt.py needs dtype: int64 (labels feed cross_entropy)")
    n_micro = cfg["global_batch_size"] // (world * cfg["micro_batch_size"])
    pad_id = int(cfg.get("pad_id", 0))

    ckpt = torch.load(args.resume, map_location="cpu") if args.resume else None
    if ckpt is not None:  # the model's shape comes from the checkpoint
        for k in ("d_model", "layers", "heads", "vocab_size"):
            setattr(args, k, ckpt["model_args"][k])
    vocab = vocab_size_of(args)
    model = GPT(vocab, args.d_model, args.layers, args.heads)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    params = list(model.parameters())

    loader = polyload.Loader(cfg)  # rank: torch.distributed's, else 0
    start = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        torch.set_rng_state(ckpt["rng"])
        start = int(ckpt["step"])

    log_file = None
    if args.log_batches:
        path = args.log_batches
        if "{rank}" in path:
            path = path.replace("{rank}", str(rank))
        elif world > 1:
            path = f"{path}.rank{rank}"
        log_file = open(path, "a")
    metrics = open(args.metrics, "a") if args.metrics and rank == 0 else None

    n_params = sum(p.numel() for p in params)
    if rank == 0:
        print(f"train_gpt: {n_params / 1e6:.2f} M parameters (vocab {vocab}, d_model "
              f"{args.d_model}, {args.layers} layers, {args.heads} heads); dp {world}, "
              f"{n_micro} micro-batches of {cfg['micro_batch_size']} x {cfg['seq_length']} "
              f"per rank per step; steps {start}..{steps - 1}; torch threads "
              f"{torch.get_num_threads()}", flush=True)

    model.train()
    t_start = time.perf_counter()
    tokens_total = 0
    for step in range(start, steps):
        t0 = time.perf_counter()
        batches = [next(loader) for _ in range(n_micro)]
        loss_sum = torch.zeros(())
        n_loss = n_tokens = 0
        for mb, b in enumerate(batches):
            if log_file is not None:
                log_file.write(json.dumps({"step": step, "rank": rank,
                                           "dp_rank": loader.rank_info["dp_rank"],
                                           "micro_batch": mb, "sha256": batch_sha256(b)}) + "\n")
            labels = b["labels"]
            assert torch.equal(labels != -100, b["loss_mask"] > 0), "labels and loss_mask disagree"
            logits = model(b["input_ids"], b["position_ids"], b["cu_seqlens"])
            loss = F.cross_entropy(logits.view(-1, vocab), labels.view(-1),
                                   ignore_index=-100, reduction="sum")
            loss.backward()
            loss_sum += loss.detach()
            n_loss += int(b["loss_mask"].sum())
            n_tokens += int((b["input_ids"] != pad_id).sum())
        # One all-reduce: gradients (summed over tokens and ranks), loss and token counts.
        flat = torch.cat([p.grad.reshape(-1) for p in params]
                         + [loss_sum.reshape(1), torch.tensor([n_loss, n_tokens], dtype=torch.float32)])
        if world > 1:
            dist.all_reduce(flat)
        n_loss_all = float(flat[-2])
        n_tokens_all = int(flat[-1])
        # Every micro-batch carries the step's count of loss tokens (all ranks): the
        # divisor that stays exact when ranks carry unequal tokens (balance:
        # variable_length); -1 for instruction data or images, where the sum above counts.
        known = int(batches[0].get("step_loss_tokens", -1)) if batches else -1
        if known >= 0:
            assert known == n_loss_all, "step_loss_tokens and the summed loss_mask disagree"
            n_loss_all = float(known)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p)).div_(max(n_loss_all, 1.0))
            offset += n
        step_loss = float(flat[-3]) / max(n_loss_all, 1.0)
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        lr = args.lr * min(1.0, (step + 1) / max(args.warmup, 1))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        tokens_total += n_tokens_all
        if rank == 0:
            if metrics is not None:
                metrics.write(json.dumps({"step": step, "loss": step_loss, "tokens": n_tokens_all,
                                          "tokens_per_s": n_tokens_all / dt, "lr": lr}) + "\n")
                metrics.flush()
            if (step + 1) % args.log_every == 0 or step == steps - 1:
                print(f"step {step:5d} | loss {step_loss:7.4f} | {n_tokens_all / dt:8.0f} tokens/s "
                      f"| lr {lr:.2e}", flush=True)

    if log_file is not None:
        log_file.close()
    if metrics is not None:
        metrics.close()
    if args.save:
        if rank == 0:
            ckpt = {"step": steps, "model": model.state_dict(), "optimizer": opt.state_dict(),
                    "loader": loader.state_dict(), "rng": torch.get_rng_state(),
                    "model_args": {"d_model": args.d_model, "layers": args.layers,
                                   "heads": args.heads, "vocab_size": vocab}}
            tmp = args.save + ".tmp"
            torch.save(ckpt, tmp)
            os.replace(tmp, args.save)
        if world > 1:
            dist.barrier()
    if rank == 0:
        secs = time.perf_counter() - t_start
        st = loader.stats()
        print(f"train_gpt: {steps - start} steps, {tokens_total} tokens (non-padding, all ranks) "
              f"in {secs:.1f} s = {tokens_total / max(secs, 1e-9):.0f} tokens/s; loader: padding "
              f"{100 * st['padding_fraction']:.2f}%, sources "
              + ", ".join(f"{k} {v['realized_fraction']:.2f}" for k, v in st["sources"].items())
              + (f"; saved {args.save}" if args.save else ""), flush=True)
    loader.close()
    if world > 1:
        dist.barrier()  # every rank done before the process group goes (gloo aborts otherwise)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
