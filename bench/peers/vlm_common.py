"""Shared parts of the image-text peer harnesses (bench/peers/peer_vlm_*.py): the corpus, the
PyTorch loop and the checks.  Only stdlib, numpy and torch (and Pillow in the peers), so that
it imports in every peer's venv.

The work is the same for every loader:

- the real photo-caption WebDataset of ``scripts/make_vlm_corpus.py --tile 4 --per-shard 32``
  (``data/vlm_bench``: 26 photos of scikit-image, scikit-learn and matplotlib plus 4 crops
  of each, 130 samples in 5 shards), as two sources: ``photos_a`` = shards 0-2 (96 samples)
  and ``photos_b`` = shards 3-4 (34 samples), token weights 0.7 / 0.3;
- an image becomes ``[3, 336, 336]`` uint8 (shorter side to 336, bicubic, centre crop:
  ``fixed`` mode of polyload; Pillow for the peers, as bench/images/image_decode.py), 576 visual
  tokens (24 x 24 patches of 14); a caption becomes its UTF-8 bytes as tokens plus an end
  token 257 (polyload's byte tokenizer), so a sample is 576 + len(caption) + 1 tokens;
- peers deliver micro-batches of ``PEER_BATCH`` samples (``pixel_values`` [B, 3, 336, 336]
  uint8, ``input_ids`` [B, L] of the caption tokens padded with 258); polyload packs samples
  into sequences of 2048 tokens (placeholder runs of 576 for each image, ``pixel_values``
  of all images of the micro-batch), micro-batches of 2 sequences;
- a step (for the mixture error) is 16 sequences of 2048 for polyload (~29k tokens) and 40
  samples (5 micro-batches of 8, ~29k tokens) for a peer;
- the loop (``drive``) sums ``pixel_values`` and ``input_ids`` of every micro-batch and
  counts images.

A sample is identified by its WebDataset key (unique in the corpus); polyload's images by a
hash of their pixels (``polyload_image_index``: polyload's own decode of every sample).
"""
import hashlib
import json
import os
import sys
import tarfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common as C  # noqa: E402  (cpu_seconds_tree, kill_descendants)

ROOT = C.ROOT
DATA = os.path.join(ROOT, "data", "vlm_bench")
OUT = os.path.join(ROOT, "bench", "out", "vlm_peers")
SOURCES = [("photos_a", [0, 1, 2], 0.7), ("photos_b", [3, 4], 0.3)]
NAMES = [n for n, _, _ in SOURCES]
WEIGHTS = [w for _, _, w in SOURCES]
SIZE, PATCH = 336, 14
VISUAL = (SIZE // PATCH) ** 2  # 576
EOS, PAD = 257, 258
PEER_BATCH = 8
STEP_SAMPLES = 40  # a peer's step: 5 micro-batches of 8 (~29k tokens, as polyload's 16 x 2048)
EXTS = ("jpg", "jpeg", "png", "webp")


def shard_paths(i):
    return [os.path.join(DATA, f"shard-{k:06d}.tar") for k in SOURCES[i][1]]


def read_samples(i):
    """[(key, {ext: bytes})] of source i, in file order (stdlib tarfile)."""
    out = []
    for p in shard_paths(i):
        with tarfile.open(p) as t:
            cur, key = {}, None
            for m in t.getmembers():
                base = os.path.basename(m.name)
                k, ext = base.split(".", 1)
                if k != key and cur:
                    out.append((key, cur))
                    cur = {}
                key = k
                cur[ext] = t.extractfile(m).read()
            if cur:
                out.append((key, cur))
    return out


def catalogue():
    """key -> (source index, tokens of the sample)."""
    cat = {}
    for i in range(len(SOURCES)):
        for key, s in read_samples(i):
            cat[key] = (i, VISUAL + len(s["txt"]) + 1)
    return cat


def peer_weights():
    """Sample probabilities that make the token weights 0.7/0.3 (a peer mixes samples):
    w_s / mean tokens per sample of s, normalized."""
    cat = catalogue()
    mean = []
    for i in range(len(SOURCES)):
        t = [n for s, n in cat.values() if s == i]
        mean.append(sum(t) / len(t))
    p = [w / m for w, m in zip(WEIGHTS, mean)]
    return [x / sum(p) for x in p]


def pillow_fixed(im):
    """PIL image -> uint8 [3, 336, 336]: shorter side to 336 (bicubic), centre crop."""
    from PIL import Image

    w, h = im.size
    sc = SIZE / min(w, h)
    nw, nh = max(SIZE, round(w * sc)), max(SIZE, round(h * sc))
    im = im.convert("RGB").resize((nw, nh), Image.BICUBIC)
    x0, y0 = (nw - SIZE) // 2, (nh - SIZE) // 2
    return np.ascontiguousarray(np.asarray(im.crop((x0, y0, x0 + SIZE, y0 + SIZE)))
                                .transpose(2, 0, 1))


def caption_ids(txt):
    return list(txt) + [EOS] if isinstance(txt, bytes) else list(txt.encode()) + [EOS]


def collate(samples):
    """[(key, image [3,336,336] uint8, caption ids)] -> the peers' micro-batch dict."""
    import torch

    n = max(len(c) for _, _, c in samples)
    ids = torch.full((len(samples), n), PAD, dtype=torch.int64)
    for j, (_, _, c) in enumerate(samples):
        ids[j, :len(c)] = torch.tensor(c, dtype=torch.int64)
    return {"pixel_values": torch.from_numpy(np.stack([im for _, im, _ in samples])),
            "input_ids": ids, "keys": [k for k, _, _ in samples]}


def drive(batches, warmup, seconds):
    """The PyTorch loop: per micro-batch, sum ``pixel_values`` and ``input_ids`` and count
    images; after ``warmup`` micro-batches, time at least ``seconds``.  Returns images/s and
    CPU-s (this process and its descendants: the loader's workers) per 1,000 images."""
    import torch

    touched = torch.zeros((), dtype=torch.float64)
    it = iter(batches)
    for _ in range(warmup):
        b = next(it)
        touched += b["pixel_values"].sum()
    images = n = 0
    cpu0 = C.cpu_seconds_tree()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        b = next(it)
        pv = b["pixel_values"]
        images += pv.shape[0]
        touched += pv.sum(dtype=torch.int64) + b["input_ids"].sum()
        n += 1
        if time.perf_counter() >= deadline and n >= 4:
            break
    dt = time.perf_counter() - t0
    cpu = C.cpu_seconds_tree() - cpu0
    return {"images_per_s": images / dt, "cpu_s_per_k_images": cpu / images * 1e3,
            "images": images, "micro_batches": n, "seconds": dt, "checksum": float(touched)}


def batch_key(b):
    """Hash of a micro-batch (pixel_values and input_ids), for equality checks."""
    h = hashlib.blake2b(digest_size=16)
    for name in ("pixel_values", "input_ids"):
        h.update(np.ascontiguousarray(np.asarray(b[name])).tobytes())
    return h.hexdigest()


def mixture_steps(sample_keys, cat, step_samples=STEP_SAMPLES):
    """Per-step per-source tokens from the delivered keys (steps of ``step_samples``)."""
    rows = []
    for s in range(0, len(sample_keys) - step_samples + 1, step_samples):
        r = [0] * len(SOURCES)
        for k in sample_keys[s:s + step_samples]:
            i, t = cat[k]
            r[i] += t
        rows.append(r)
    return rows


def mixture_report(rows):
    m = C.mixture_error(rows, WEIGHTS)
    m["per_step_max_fraction"] = m["per_step_max"] / m["tokens_per_step"]
    return m


def resume_report(a, b):
    """a: keys of the uninterrupted run's micro-batches K..K+n-1, b: the resumed run's."""
    same = sum(x == y for x, y in zip(a, b))
    first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return {"exact": same == len(a) == len(b), "equal_micro_batches": same, "of": len(a),
            "first_difference": first}


def main(peer, argv=None):
    """MODE: prepare | throughput | startup | mixture | resume.  Prints one JSON line."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--t0", type=float, help="startup: the parent's time.time() before fork")
    ap.add_argument("--k", type=int, default=24, help="resume: micro-batches before the state")
    ap.add_argument("--n", type=int, default=20, help="resume: micro-batches compared after")
    ap.add_argument("--steps", type=int, default=30, help="mixture: steps")
    args = ap.parse_args(argv)
    os.makedirs(OUT, exist_ok=True)
    res = {"peer": peer.NAME, "mode": args.mode}
    if args.mode == "prepare":
        res.update(peer.prepare() or {})
    elif args.mode == "throughput":
        it = peer.loader()
        res.update(drive(it, warmup=4, seconds=args.seconds))
        peer.close(it)
    elif args.mode == "startup":
        it = peer.loader()
        next(iter(it))
        res["start_to_first_batch_s"] = time.time() - args.t0
        print(json.dumps(res), flush=True)
        C.kill_descendants()
        os._exit(0)
    elif args.mode == "mixture":
        res.update(peer.mixture(args.steps))
    elif args.mode == "resume":
        res.update(peer.resume(args.k, args.n))
    print(json.dumps(res), flush=True)
    C.kill_descendants()
    os._exit(0)  # no interpreter teardown of worker processes / threads
