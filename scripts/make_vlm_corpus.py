#!/usr/bin/env python3
"""Build a small real image-caption WebDataset from photos that Python packages ship.

Sources (only files inside the installed wheels; nothing is downloaded):

    scikit-image  skimage/data/*.{png,jpg}   caption: the loader's docstring (its summary and
                                             description); licence: the docstring's Notes /
                                             licence sentence
    scikit-learn  sklearn/datasets/images/{china,flower}.jpg   caption written from the
                                             picture, licence and attribution from the
                                             README.txt shipped beside them
    matplotlib    mpl-data/sample_data/grace_hopper.jpg        caption and licence from
                                             matplotlib's own docs of the sample

Each sample is written as WebDataset members sharing a key: `<key>.<ext>` (the original
bytes; a few PNGs are also re-encoded as lossless WebP so that every decoder is exercised),
`<key>.txt` (the caption) and `<key>.json` ({"caption", "license", "origin"}).  Shards hold
--per-shard samples each: `<out>/shard-000000.tar`, ...  With --tile N, every photo also
appears N times cropped at different offsets and scales (for benchmarks).

Writes <out>/LICENSES.json (key -> licence, origin) beside the shards.
"""

import argparse
import inspect
import io
import json
import os
import re
import sys
import tarfile

import matplotlib
import skimage
import skimage.data
import sklearn.datasets

# scikit-image loaders whose file is inside the wheel (no pooch download).
SKIMAGE = [
    ("astronaut", "astronaut.png"),
    ("brick", "brick.png"),
    ("camera", "camera.png"),
    ("cell", "cell.png"),
    ("chelsea", "chelsea.png"),
    ("coffee", "coffee.png"),
    ("coins", "coins.png"),
    ("colorwheel", "color.png"),
    ("grass", "grass.png"),
    ("gravel", "gravel.png"),
    ("horse", "horse.png"),
    ("hubble_deep_field", "hubble_deep_field.jpg"),
    ("immunohistochemistry", "ihc.png"),
    ("logo", "logo.png"),
    ("microaneurysms", "microaneurysms.png"),
    ("moon", "moon.png"),
    ("page", "page.png"),
    ("retina", "retina.jpg"),
    ("rocket", "rocket.jpg"),
    ("text", "text.png"),
]
# Re-encoded as lossless WebP as well (same caption, key suffixed _webp).
WEBP_TOO = {"chelsea", "coffee", "astronaut"}

SKLEARN = {
    "china": "A view of an old Chinese temple with a pagoda-like roof and trees.",
    "flower": "A close-up photograph of a pink flower.",
}
MATPLOTLIB = {
    "grace_hopper": (
        "grace_hopper.jpg",
        "Official portrait of Rear Admiral Grace M. Hopper, computer scientist, in "
        "US Navy uniform.",
        "Public domain (US Navy photograph), as shipped in matplotlib's sample data.",
    ),
}


def _doc_caption_and_licence(fn):
    """Caption: the docstring up to its first numpydoc section; licence: the sentence of
    the Notes (or of the description) that speaks of copyright, licence or public domain."""
    doc = inspect.getdoc(fn) or ""
    sections = re.split(r"\n(?=[A-Z][a-z]+\n-{3,})", doc)
    head = sections[0].strip()
    rest = "\n".join(sections[1:])
    caption = re.sub(r"\s+", " ", re.sub(r"`([^`<]*)<[^>]*>`_*", r"\1", head)).strip()
    paras = [re.sub(r"\s+", " ", q).strip() for q in re.split(r"\n\s*\n", doc)]
    paras = [re.sub(r"^Notes -+ ", "", q) for q in paras]
    keep = [q for q in paras if re.search(
        r"copyright|licen[cs]e|public domain|CC0|Creative Commons", q, flags=re.I)]
    licence = " ".join(keep) or "See scikit-image's data/README.txt."
    caption = re.sub(r"\s*No (known )?copyright restrictions[^.]*\.", "", caption).strip()
    return caption, licence, rest


def _sklearn_licences():
    path = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", "README.txt")
    out = {}
    with open(path, encoding="utf-8") as f:
        blocks = f.read().split("Image: ")
    for b in blocks[1:]:
        name = b.split("\n", 1)[0].strip().rsplit(".", 1)[0]
        body = re.sub(r"\s+", " ", b.split("\n", 1)[1]).strip()
        out[name] = body
    return out


def samples():
    """(key, ext, bytes, caption, licence, origin) of every photo, in a fixed order."""
    skdir = os.path.dirname(skimage.data.__file__)
    out = []
    for fn_name, fname in SKIMAGE:
        path = os.path.join(skdir, fname)
        if not os.path.isfile(path):
            continue
        caption, licence, _ = _doc_caption_and_licence(getattr(skimage.data, fn_name))
        with open(path, "rb") as f:
            data = f.read()
        ext = fname.rsplit(".", 1)[1]
        origin = f"scikit-image {skimage.__version__}: skimage.data.{fn_name} ({fname})"
        out.append((f"skimage_{fn_name}", ext, data, caption, licence, origin))
        if fn_name in WEBP_TOO:
            from PIL import Image

            buf = io.BytesIO()
            Image.open(io.BytesIO(data)).convert("RGB").save(buf, "WEBP", lossless=True)
            out.append((f"skimage_{fn_name}_webp", "webp", buf.getvalue(), caption,
                        licence, origin + ", re-encoded as lossless WebP"))
    lic = _sklearn_licences()
    imdir = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images")
    for name, caption in SKLEARN.items():
        with open(os.path.join(imdir, name + ".jpg"), "rb") as f:
            data = f.read()
        out.append((f"sklearn_{name}", "jpg", data, caption, lic.get(name, ""),
                    f"scikit-learn {sklearn.__version__}: datasets/images/{name}.jpg"))
    mpl = os.path.join(matplotlib.get_data_path(), "sample_data")
    for name, (fname, caption, licence) in MATPLOTLIB.items():
        with open(os.path.join(mpl, fname), "rb") as f:
            data = f.read()
        out.append((f"matplotlib_{name}", "jpg", data, caption, licence,
                    f"matplotlib {matplotlib.__version__}: sample_data/{fname}"))
    return out


def tiled(base, n):
    """n crops of each photo at different offsets and scales, re-encoded as JPEG (q 90)."""
    from PIL import Image

    out = []
    for k in range(n):
        for key, ext, data, caption, licence, origin in base:
            im = Image.open(io.BytesIO(data)).convert("RGB")
            w, h = im.size
            f = 0.5 + 0.5 * ((k * 37) % 11) / 10.0
            cw, ch = max(32, int(w * f)), max(32, int(h * f))
            x0 = (k * 53) % max(1, w - cw + 1)
            y0 = (k * 29) % max(1, h - ch + 1)
            buf = io.BytesIO()
            im.crop((x0, y0, x0 + cw, y0 + ch)).save(buf, "JPEG", quality=90)
            out.append((f"{key}_crop{k:04d}", "jpg", buf.getvalue(), caption, licence,
                        origin + f", crop {cw}x{ch}+{x0}+{y0}"))
    return out


def _add(tar, name, data):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 0
    ti.mode = 0o644
    tar.addfile(ti, io.BytesIO(data))


def write_shards(items, out, per_shard):
    os.makedirs(out, exist_ok=True)
    paths = []
    for s in range(0, len(items), per_shard):
        path = os.path.join(out, f"shard-{s // per_shard:06d}.tar")
        tmp = path + ".tmp"
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, ext, data, caption, licence, origin in items[s:s + per_shard]:
                _add(tar, f"{key}.{ext}", data)
                _add(tar, f"{key}.txt", caption.encode("utf-8"))
                meta = {"caption": caption, "license": licence, "origin": origin}
                _add(tar, f"{key}.json", json.dumps(meta, ensure_ascii=False).encode())
        os.replace(tmp, path)
        paths.append(path)
    with open(os.path.join(out, "LICENSES.json"), "w", encoding="utf-8") as f:
        json.dump({k: {"license": lic, "origin": o} for k, _, _, _, lic, o in items}, f,
                  indent=1, ensure_ascii=False)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data/vlm")
    ap.add_argument("--per-shard", type=int, default=8)
    ap.add_argument("--tile", type=int, default=0, help="add N crops of every photo")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    stamp = os.path.join(args.out, "LICENSES.json")
    if os.path.exists(stamp) and not args.force and args.tile == 0:
        print(f"{args.out}: up to date")
        return 0
    items = samples()
    if args.tile:
        items = items + tiled(items, args.tile)
    paths = write_shards(items, args.out, args.per_shard)
    nbytes = sum(os.path.getsize(p) for p in paths)
    print(f"{args.out}: {len(items)} samples in {len(paths)} shards, {nbytes / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
