#!/usr/bin/env python3
"""Train a tiny vision-language model on CPU for a few steps, fed by polyload.Loader.

The model is the smallest thing shaped like Qwen2-VL: a patch embedding (a linear layer on
each 3x14x14 uint8 patch of ``pixel_values``, normalized here, on the trainer's device, with
CLIP's mean and std), a 2x2 patch merger (Qwen2-VL's patch order puts the four patches of a
merge block next to each other, so merging is a reshape), and a small causal GPT over the
packed sequence whose image placeholder tokens (``input_ids == 256``) are replaced by the
merged image features (``image_positions`` says where each image's run starts, and its
length).  Attention stays within each packed document (``cu_seqlens``); the loss is the
cross-entropy on ``labels`` (placeholders and padding are -100).

    .venv/bin/python scripts/make_vlm_corpus.py --out data/vlm
    .venv/bin/python examples/train_vlm.py --steps 5

Prints one JSON line per step: step, loss, images, visual tokens, seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

import polyload

IMAGE, VOCAB, D, P, MERGE = 256, 259, 128, 14, 2
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073])
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711])


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x, segments, causal):
        n = x.shape[0]
        q, k, v = self.qkv(self.ln1(x)).view(n, 3, 4, D // 4).permute(1, 2, 0, 3)
        outs = [F.scaled_dot_product_attention(q[:, s:e], k[:, s:e], v[:, s:e],
                                               is_causal=causal) for s, e in segments]
        x = x + self.proj(torch.cat(outs, 1).permute(1, 0, 2).reshape(n, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyVLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Linear(3 * P * P, D)
        self.vit = Block()
        self.merge = nn.Linear(MERGE * MERGE * D, D)
        self.emb = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(4096, D)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def encode_images(self, pixel_values, grid_thw):
        # uint8 [n_patches, 3*P*P] -> normalized float, channel-major per patch.
        x = pixel_values.float().div(255.0).view(-1, 3, P * P)
        x = ((x - MEAN[None, :, None]) / STD[None, :, None]).view(-1, 3 * P * P)
        x = self.patch(x)
        sizes = (grid_thw[:, 0] * grid_thw[:, 1] * grid_thw[:, 2]).tolist()
        bounds, at = [], 0
        for s in sizes:  # bidirectional attention within each image
            bounds.append((at, at + s))
            at += s
        x = self.vit(x, bounds, causal=False)
        return self.merge(x.view(-1, MERGE * MERGE * D))  # [visual tokens, D]

    def forward(self, batch):
        ids = batch["input_ids"].reshape(-1)
        x = self.emb(ids) + self.pos(batch["position_ids"].reshape(-1))
        if "pixel_values" in batch:
            feats = self.encode_images(batch["pixel_values"], batch["image_grid_thw"])
            rows = torch.cat([torch.arange(int(s), int(s) + int(n))
                              for s, n in batch["image_positions"].tolist()])
            assert bool((ids[rows] == IMAGE).all()), "image_positions must hold placeholders"
            x = x.index_put((rows,), feats + self.pos(batch["position_ids"].reshape(-1)[rows]))
        cu = batch["cu_seqlens"].tolist()
        segs = list(zip(cu[:-1], cu[1:]))
        for b in self.blocks:
            x = b(x, segs, causal=True)
        return self.head(self.ln(x))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--config", default=os.path.join(here, "train_vlm.yaml"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    cfg["train_steps"] = args.steps
    cfg.setdefault("topology", {})["dp"] = 1
    base = os.path.dirname(os.path.abspath(args.config))
    for s in cfg["sources"]:  # paths relative to the repository root, as make demo runs it
        if not os.path.isabs(s["path"]):
            s["path"] = os.path.join(os.path.dirname(base), s["path"])
    loader = polyload.Loader(cfg, rank=0)
    model = TinyVLM()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    per_step = cfg["global_batch_size"] // cfg["micro_batch_size"]
    it = iter(loader)
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum, n_tok, n_img, n_vis = 0.0, 0, 0, 0
        for _ in range(per_step):
            batch = next(it)
            logits = model(batch)
            labels = batch["labels"].reshape(-1)
            loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
            loss.backward()
            loss_sum += float(loss.detach())
            n_tok += int((labels != -100).sum())
            if "image_grid_thw" in batch:
                n_img += int(batch["image_grid_thw"].shape[0])
                n_vis += int(batch["image_positions"][:, 1].sum())
        for p in model.parameters():
            if p.grad is not None:
                p.grad /= max(n_tok, 1)
        opt.step()
        print(json.dumps({"step": step, "loss": round(loss_sum / max(n_tok, 1), 4),
                          "images": n_img, "visual_tokens": n_vis,
                          "seconds": round(time.perf_counter() - t0, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
