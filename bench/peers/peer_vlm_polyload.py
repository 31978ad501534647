#!/usr/bin/env python3
"""polyload on the image-text work of bench/peers/vlm_common.py: ``polyload.Loader`` over the
two WebDataset sources as they are (``type: webdataset``, fixed 336, byte-token captions,
``index: file`` sidecars), token weights 0.7/0.3, packed (best_fit) into sequences of 2048,
micro-batches of 2, ``threads: 2``, ``prefetch: 4`` (the README's defaults).

    .venv/bin/python bench/peers/peer_vlm_polyload.py MODE   (see vlm_common.main)
"""
import copy
import hashlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vlm_common as V  # noqa: E402

NAME = "polyload"
SEQ = 2048
MB = 2
GBS = 16  # sequences per step: 8 micro-batches of 2 x 2048 (~42 samples, as a peer's 32-48)


def config():
    srcs = []
    for (name, shards, w), i in zip(V.SOURCES, range(len(V.SOURCES))):
        srcs.append({"name": name, "type": "webdataset", "weight": w, "caption": "txt",
                     "eos_id": V.EOS,
                     "path": os.path.join(V.DATA, "shard-{%s}.tar" % ",".join(
                         f"{k:06d}" for k in shards)) if len(shards) > 1 else
                     V.shard_paths(i)[0],
                     "image": {"mode": "fixed", "size": V.SIZE, "patch_size": V.PATCH,
                               "token_id": 256}})
    return {"seed": V.C.SEED, "seq_length": SEQ, "global_batch_size": GBS,
            "micro_batch_size": MB, "pad_id": V.PAD, "long_documents": "truncate",
            "threads": 2, "prefetch": 4, "topology": {"dp": 1}, "sources": srcs}


def loader():
    import polyload

    return polyload.Loader(config(), rank=0)


def close(it):
    it.close()


def prepare():
    """polyload needs no conversion: it reads the shards; opening builds the .plwds
    sidecars once (as a first run would)."""
    it = loader()
    next(iter(it))
    it.close()
    return {"data": V.DATA}


def image_index():
    """hash of polyload's decoded image -> key, from polyload's own decode of each sample."""
    from polyload import _core

    out = {}
    for i in range(len(V.SOURCES)):
        path = config()["sources"][i]["path"]
        src = _core.Source.open_webdataset(path, 256, mode="fixed", size=V.SIZE,
                                           patch_size=V.PATCH, index=-1)
        keys = [k for k, _ in V.read_samples(i)]
        assert len(src) == len(keys), (len(src), len(keys))
        for j in range(len(src)):
            a = np.asarray(src.read_image(j))
            out[hashlib.blake2b(a.tobytes(), digest_size=12).digest()] = keys[j]
    return out


def batch_keys(b, index):
    pv = b["pixel_values"].numpy()
    return [index[hashlib.blake2b(pv[j].tobytes(), digest_size=12).digest()]
            for j in range(pv.shape[0])]


def mixture(steps):
    """Per-source tokens of each step (8 micro-batches), from the delivered images' keys
    (each image is one sample: 576 + caption + 1 tokens)."""
    cat, index = V.catalogue(), image_index()
    it = iter(loader())
    rows = []
    for _ in range(steps):
        r = [0] * len(V.SOURCES)
        for _ in range(GBS // MB):
            for k in batch_keys(next(it), index):
                i, t = cat[k]
                r[i] += t
        rows.append(r)
    return {"mixture": V.mixture_report(rows), "unit": "tokens (packed steps of 16 x 2048)"}


def resume(k, n):
    pl = loader()
    it = iter(pl)
    for _ in range(k):
        next(it)
    st = copy.deepcopy(pl.state_dict())
    ref = [V.batch_key(next(it)) for _ in range(n)]
    pl.close()
    import pickle

    pl2 = loader()
    pl2.load_state_dict(pickle.loads(pickle.dumps(st)))
    it2 = iter(pl2)
    got = [V.batch_key(next(it2)) for _ in range(n)]
    return V.resume_report(ref, got)


if __name__ == "__main__":
    V.main(sys.modules[__name__])
