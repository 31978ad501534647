#!/usr/bin/env python3
"""Megatron-Energon on the image-text work of bench/peers/vlm_common.py.

Data: each source written by webdataset's ``ShardWriter`` (Energon's docs: write
WebDataset tars, then ``energon prepare``) into bench/out/vlm_peers/energon/NAME/, prepared
with ``energon prepare DIR --non-interactive --split-ratio 1,0,0 --sample-type
CrudeWebdataset`` (the crude type plus a cooker: the documented way for samples whose
image member has one of several extensions), and a metadataset (``MetadatasetV2``,
``blend:`` with the sample weights that give 0.7/0.3 of tokens, vlm_common.peer_weights).

Configured as Energon's docs recommend: ``get_train_dataset(metadataset, batch_size=8,
shuffle_buffer_size=100, max_samples_per_sequence=100, worker_config=WorkerConfig(rank=0,
world_size=1, num_workers=2), task_encoder=TE())`` and ``get_savable_loader``; ``TE``: its
``SampleDecoder(image_decode="pil")``, a cooker doing the Pillow resize of
bench/images/image_decode.py (Energon ships no resizer) and the byte tokens, and a ``batch`` that
collates.  Resume: ``save_state_rank`` / ``restore_state_rank``.

    bench/peers/.venvs/energon/bin/python bench/peers/peer_energon.py MODE
"""
import dataclasses
import os
import pickle
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vlm_common as V  # noqa: E402
from megatron.energon import Sample, basic_sample_keys  # noqa: E402

NAME = "energon"
DIR = os.path.join(V.OUT, "energon")
MDS = os.path.join(DIR, "blend.yaml")


def prepare():
    import webdataset as wds

    shutil.rmtree(DIR, ignore_errors=True)
    for i, (name, _, _) in enumerate(V.SOURCES):
        d = os.path.join(DIR, name)
        os.makedirs(d)
        with wds.ShardWriter(os.path.join(d, "shard-%06d.tar"), maxcount=32) as w:
            for key, s in V.read_samples(i):
                w.write({"__key__": key, **s})
        energon = os.path.join(os.path.dirname(sys.executable), "energon")
        subprocess.run([energon, "prepare", d, "--non-interactive", "--split-ratio",
                        "1,0,0", "--sample-type", "CrudeWebdataset"],
                       check=True, capture_output=True, text=True)
    p = V.peer_weights()
    with open(MDS, "w") as f:
        f.write("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n"
                "  train:\n    blend:\n")
        for (name, _, _), w in zip(V.SOURCES, p):
            f.write(f"      - weight: {w:.6f}\n        path: ./{name}\n")
    return {"dir": DIR, "sample_weights": p}


@dataclasses.dataclass
class ImageCaption(Sample):
    """The cooked sample: ``image`` uint8 [3, 336, 336], ``ids`` the caption's byte tokens.
    A subclass of Energon's ``Sample`` carrying ``basic_sample_keys`` (its restore key), as
    Energon's cooking docs require for its state to restore the shuffle buffer."""
    image: object = None
    ids: object = None


def _cook(sample):
    ext = next(e for e in V.EXTS if e in sample)
    return ImageCaption(**basic_sample_keys(sample), image=V.pillow_fixed(sample[ext]),
                        ids=V.caption_ids(sample["txt"]))


def _task_encoder():
    from megatron.energon import Cooker, DefaultTaskEncoder, stateless
    from megatron.energon.flavors.webdataset.sample_decoder import SampleDecoder

    class TE(DefaultTaskEncoder):
        cookers = [Cooker(stateless(_cook))]
        decoder = SampleDecoder(image_decode="pil")

        def batch(self, samples):
            return V.collate([(s.__key__.rsplit("/", 1)[-1], s.image, s.ids)
                              for s in samples])

        def encode_batch(self, batch):
            return batch

    return TE()


def loader():
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
    ds = get_train_dataset(MDS, batch_size=V.PEER_BATCH, shuffle_buffer_size=100,
                           max_samples_per_sequence=100, worker_config=wc,
                           task_encoder=_task_encoder())
    return get_savable_loader(ds)


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
    ld = loader()
    it = iter(ld)
    for _ in range(k):
        next(it)
    st = pickle.loads(pickle.dumps(ld.save_state_rank()))
    ref = [V.batch_key(next(it)) for _ in range(n)]
    ld2 = loader()
    ld2.restore_state_rank(st)
    it2 = iter(ld2)
    got = [V.batch_key(next(it2)) for _ in range(n)]
    return V.resume_report(ref, got)


if __name__ == "__main__":
    V.main(sys.modules[__name__])
