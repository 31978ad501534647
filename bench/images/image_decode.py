#!/usr/bin/env python3
"""Images/s per core, decode + resize to the target, polyload vs webdataset + Pillow.

Same shards, same targets, one thread each (so images/s is images/s per core):

    polyload        Source.read_image (C: libjpeg-turbo with DCT scaling, libspng, libwebp,
                    libswscale), every sample of the shards
    wds+Pillow      webdataset.WebDataset(shards).decode("pil"), then Pillow's bicubic resize
                    (fixed: shorter side to 336, centre crop; native: Qwen2-VL smart_resize),
                    then numpy to the same uint8 layout ([3, H, W], or Qwen2-VL patches)
    wds+Pillow+draft  the same, with Image.draft() so Pillow's JPEG decoder also uses DCT
                    scaling (the fairest Pillow can do)
    energon         Megatron-Energon (--energon-python PY, its own venv; the shards prepared
                    by `energon prepare DIR --non-interactive --split-ratio 1,0,0
                    --sample-type CrudeWebdataset`): get_train_dataset + get_loader, one
                    thread (num_workers 0, no shuffle, batch 1), its SampleDecoder decoding
                    images to PIL, and a cooker doing the Pillow resize and layout above
                    (Energon ships no resizer of its own; its examples use torchvision or
                    Pillow); "energon+draft" decodes in the cooker from the raw bytes with
                    Image.draft (Energon's decoder has no draft)

Paired repeats: each repeat runs all three in rotating order.  Prints one JSON object per
(mode, loader, repeat), with wall and CPU seconds, and a summary of the medians of images
per CPU-second (= images/s per core: one thread; unlike wall time it does not move when
other jobs share the machine) and polyload's ratio to each.

    .venv/bin/python scripts/make_vlm_corpus.py --out data/vlm_bench --tile 4 --per-shard 32
    .venv/bin/python bench/images/image_decode.py "data/vlm_bench/shard-*.tar" --repeats 5

--python PY runs the Pillow loaders under another interpreter (e.g. a venv with
Pillow-SIMD), through this same file.
"""

import argparse
import glob
import io
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import results as bench_results  # noqa: E402


def smart_resize(h, w, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280):
    """Qwen2-VL's smart_resize, as transformers' image_processing_pil_qwen2_vl.py."""
    h_bar = round(h / factor) * factor
    w_bar = round(w / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((h * w) / max_pixels)
        h_bar = max(factor, math.floor(h / beta / factor) * factor)
        w_bar = max(factor, math.floor(w / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        h_bar = math.ceil(h * beta / factor) * factor
        w_bar = math.ceil(w * beta / factor) * factor
    return h_bar, w_bar


def patchify(a, p=14, m=2):
    """[H, W, 3] -> [(H/p)*(W/p), 3*p*p] in Qwen2-VL order (no temporal repeat)."""
    h, w, _ = a.shape
    gh, gw = h // p, w // p
    x = a.transpose(2, 0, 1).reshape(3, gh // m, m, p, gw // m, m, p)
    return np.ascontiguousarray(x.transpose(1, 4, 2, 5, 0, 3, 6)).reshape(gh * gw, 3 * p * p)


def pillow_loader(shards, mode, draft):
    import webdataset as wds
    from PIL import Image

    def run():
        n = 0
        ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False)
        for s in ds:
            key = next(k for k in ("jpg", "jpeg", "png", "webp") if k in s)
            im = Image.open(io.BytesIO(s[key]))
            w, h = im.size
            if mode == "fixed":
                sc = 336 / min(w, h)
                nw, nh = max(336, round(w * sc)), max(336, round(h * sc))
                if draft:
                    im.draft("RGB", (nw, nh))
                im = im.convert("RGB").resize((nw, nh), Image.BICUBIC)
                x0, y0 = (nw - 336) // 2, (nh - 336) // 2
                out = np.asarray(im.crop((x0, y0, x0 + 336, y0 + 336))).transpose(2, 0, 1)
                np.ascontiguousarray(out)
            else:
                rh, rw = smart_resize(h, w)
                if draft:
                    im.draft("RGB", (rw, rh))
                im = im.convert("RGB").resize((rw, rh), Image.BICUBIC)
                patchify(np.asarray(im))
            n += 1
        return n
    return run


def _pillow_layout(im, mode, draft):
    from PIL import Image

    w, h = im.size
    if mode == "fixed":
        sc = 336 / min(w, h)
        nw, nh = max(336, round(w * sc)), max(336, round(h * sc))
        if draft:
            im.draft("RGB", (nw, nh))
        im = im.convert("RGB").resize((nw, nh), Image.BICUBIC)
        x0, y0 = (nw - 336) // 2, (nh - 336) // 2
        return np.ascontiguousarray(
            np.asarray(im.crop((x0, y0, x0 + 336, y0 + 336))).transpose(2, 0, 1))
    rh, rw = smart_resize(h, w)
    if draft:
        im.draft("RGB", (rw, rh))
    return patchify(np.asarray(im.convert("RGB").resize((rw, rh), Image.BICUBIC)))


def energon_loader(root, mode, draft):
    """Megatron-Energon's loader over an energon-prepared copy of the shards (CrudeWebdataset),
    one process, no workers: its decoder gives PIL images (or raw bytes for the draft
    variant), a cooker resizes as the Pillow loaders do."""
    import tarfile

    from PIL import Image
    from megatron.energon import (Cooker, DefaultTaskEncoder, WorkerConfig, get_loader,
                                  get_train_dataset, stateless)
    from megatron.energon.flavors.webdataset.sample_decoder import SampleDecoder

    n_samples = 0
    for f in sorted(glob.glob(os.path.join(root, "*.tar"))):
        with tarfile.open(f) as t:
            n_samples += sum(m.name.endswith(".txt") for m in t.getmembers())
    exts = ("jpg", "jpeg", "png", "webp")

    @stateless
    def cook(sample):
        key = next(k for k in exts if k in sample)
        im = sample[key]
        if draft:
            im = Image.open(io.BytesIO(im))
        return _pillow_layout(im, mode, draft)

    class TE(DefaultTaskEncoder):
        cookers = [Cooker(cook)]
        decoder = None if draft else SampleDecoder(image_decode="pil")

        def batch(self, samples):
            return samples

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)

    # Opening (index, split, task encoder) happens once, outside the timed part, as
    # polyload's Source.open_webdataset.
    ds = get_train_dataset(root, batch_size=1, worker_config=wc, task_encoder=TE(),
                           shuffle_buffer_size=None, max_samples_per_sequence=None,
                           repeat=False)
    # Energon's loader runs gc.collect() every 10 samples and freezes the objects present
    # at the start of its worker processes (gc_freeze_at_start) so those collections stay
    # cheap; with num_workers 0 there is no worker, so freeze here as its workers would
    # (without it, gc.collect over torch's objects took 30 % of the time).
    import gc
    gc.freeze()

    def run():
        n = 0
        for _ in get_loader(ds):
            n += 1
        assert n == n_samples, (n, n_samples)
        return n
    return run


def polyload_loader(shards, mode):
    from polyload import _core

    src = _core.Source.open_webdataset(shards, 1, mode=mode, index=-1)

    def run():
        for i in range(len(src)):
            src.read_image(i)
        return len(src)
    return run


def timed(fn):
    """(images, wall seconds, CPU seconds of this process).  One thread, so images per
    CPU-second is images/s per core, and it does not depend on what else the machine
    runs."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = fn()
    return n, time.perf_counter() - t0, time.process_time() - c0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shards")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--python", help="interpreter for the Pillow loaders (e.g. Pillow-SIMD)")
    ap.add_argument("--only-pillow", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--energon-python", help="interpreter of a venv with megatron-energon")
    ap.add_argument("--energon-root", help="energon-prepared copy of the shards' directory")
    ap.add_argument("--only-energon", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--modes", default="fixed,native")
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    files = sorted(glob.glob(args.shards))
    brace = "{" + ",".join(files) + "}" if len(files) > 1 else files[0]
    rows = []
    for mode in args.modes.split(","):
        if args.only_energon:
            loaders = {"energon": energon_loader(args.energon_root, mode, False),
                       "energon+draft": energon_loader(args.energon_root, mode, True)}
        else:
            loaders = {} if args.only_pillow else {"polyload": polyload_loader(brace, mode)}
        if not args.python and not args.only_energon:
            loaders["wds+Pillow"] = pillow_loader(files, mode, draft=False)
            loaders["wds+Pillow+draft"] = pillow_loader(files, mode, draft=True)
        names = list(loaders)
        for r in range(args.repeats):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                n, dt, cpu = timed(loaders[name])
                row = {"mode": mode, "loader": name + args.label, "repeat": r, "images": n,
                       "seconds": round(dt, 4), "cpu_seconds": round(cpu, 4),
                       "images_per_s": round(n / dt, 1),
                       "images_per_cpu_s": round(n / cpu, 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
            if args.energon_python:  # paired: one repeat of the peer after each of ours
                out = subprocess.run(
                    [args.energon_python, os.path.abspath(__file__), args.shards, "--repeats",
                     "1", "--only-energon", "--energon-root", args.energon_root,
                     "--modes", mode],
                    check=True, capture_output=True, text=True).stdout
                for line in out.splitlines():
                    row = json.loads(line)
                    row["repeat"] = r
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            if args.python:
                out = subprocess.run(
                    [args.python, os.path.abspath(__file__), args.shards, "--repeats", "1",
                     "--only-pillow", "--label", " (other python)"],
                    check=True, capture_output=True, text=True).stdout
                for line in out.splitlines():
                    row = json.loads(line)
                    if row.get("mode") == mode:
                        row["repeat"] = r
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    if args.only_pillow or args.only_energon:
        return 0
    summary = {}
    for mode in args.modes.split(","):
        med = {}
        for row in rows:
            if row["mode"] == mode:
                med.setdefault(row["loader"], []).append(row["images_per_cpu_s"])
        med = {k: statistics.median(v) for k, v in med.items()}
        summary[mode] = {k: {"images_per_cpu_s": v,
                             "polyload_ratio": round(med["polyload"] / v, 2)}
                         for k, v in med.items()}
    print(json.dumps({"summary": summary}))
    figures = []
    for mode, what in (("fixed", "decode + resize to 336 (fixed mode)"),
                       ("native", "decode + resize (Qwen2-VL native mode)")):
        m = summary.get(mode, {})
        if "polyload" in m and "wds+Pillow+draft" in m:
            figures.append(bench_results.record(
                f"images per CPU-second, {what}, real photos",
                m["polyload"]["images_per_cpu_s"], "images/CPU-s",
                headline=True if mode == "fixed" else None,
                peer="webdataset + Pillow, draft mode",
                peer_value=m["wds+Pillow+draft"]["images_per_cpu_s"],
                note=f"median of {args.repeats} paired repeats"))
    if figures:
        print(bench_results.write("image_decode", figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
