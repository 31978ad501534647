#!/usr/bin/env python3
"""WebDataset on the image-text work of bench/peers/vlm_common.py.

Data: each source rewritten by webdataset's own writer (``wds.ShardWriter``, 32 samples a
shard) into bench/out/vlm_peers/wds/NAME/.  Configured as webdataset's README recommends:
per source ``WebDataset(urls, resampled=True).shuffle(1000)
.decode("pil")``, a map doing the Pillow resize (bench/images/image_decode.py's fixed 336) and the
byte tokens; the sources mixed by ``wds.RandomMix(datasets, probs)`` (sample
probabilities that give 0.7/0.3 of tokens, vlm_common.peer_weights), ``batched(8)``, and
``wds.WebLoader(batch_size=None, num_workers=2)``.

    bench/peers/.venvs/webdataset/bin/python bench/peers/peer_webdataset.py MODE
"""
import glob
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vlm_common as V  # noqa: E402

NAME = "webdataset"
DIR = os.path.join(V.OUT, "wds")


def prepare():
    import webdataset as wds

    n = 0
    for i, (name, _, _) in enumerate(V.SOURCES):
        d = os.path.join(DIR, name)
        os.makedirs(d, exist_ok=True)
        for f in glob.glob(os.path.join(d, "*.tar")):
            os.remove(f)
        with wds.ShardWriter(os.path.join(d, "shard-%06d.tar"), maxcount=32) as w:
            for key, s in V.read_samples(i):
                w.write({"__key__": key, **{e: b for e, b in s.items()}})
                n += 1
    return {"samples": n, "dir": DIR}


def _sample(s):
    ext = next(e for e in V.EXTS if e in s)
    return s["__key__"], V.pillow_fixed(s[ext]), V.caption_ids(s["txt"])


def _dataset(i, seed=None):
    import webdataset as wds

    urls = sorted(glob.glob(os.path.join(DIR, V.SOURCES[i][0], "*.tar")))
    return (wds.WebDataset(urls, resampled=True, seed=seed)
            .shuffle(1000).decode("pil").map(_sample))


def loader(seed=None):
    import webdataset as wds

    mix = wds.RandomMix([_dataset(i, seed) for i in range(len(V.SOURCES))],
                        probs=V.peer_weights())
    pipe = wds.DataPipeline(mix, wds.batched(V.PEER_BATCH, collation_fn=V.collate))
    return wds.WebLoader(pipe, batch_size=None, num_workers=2, prefetch_factor=2,
                         persistent_workers=True)


def close(it):
    pass


def mixture(steps):
    cat = V.catalogue()
    it = iter(loader())
    keys = []
    while len(keys) < steps * V.STEP_SAMPLES:
        keys += next(it)["keys"]
    rows = V.mixture_steps(keys, cat)
    return {"mixture": V.mixture_report(rows), "unit": "tokens (steps of 40 samples)"}


def resume(k, n):
    """WebDataset has no loader state: look for one, then do what its docs offer instead
    (a restarted loader, here with a fixed seed on both sides), and compare."""
    wl = loader(seed=7)
    api = [a for a in ("state_dict", "load_state_dict") if hasattr(wl, a)]
    it = iter(wl)
    for _ in range(k):
        next(it)
    ref = [V.batch_key(next(it)) for _ in range(n)]
    it2 = iter(loader(seed=7))
    got = [V.batch_key(next(it2)) for _ in range(n)]
    r = V.resume_report(ref, got)
    r["state_api"] = api
    r["why"] = ("WebLoader / WebDataset have no state_dict (attributes found: %s); a "
                "restarted loader with the same seed starts from its beginning: %d of %d "
                "micro-batches after K=%d equal the uninterrupted run's"
                % (api or "none", r["equal_micro_batches"], n, k))
    r["exact"] = False if not api else r["exact"]
    return r


if __name__ == "__main__":
    V.main(sys.modules[__name__])
