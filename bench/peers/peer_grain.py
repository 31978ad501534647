#!/usr/bin/env python3
"""Google Grain in the peer table: ArrayRecord files (``array_record``'s
``ArrayRecordWriter``, one record per sample: the uint16 bytes of seq_length+1 tokens)
read by ``grain.sources.ArrayRecordDataSource`` through Grain's dataset API.

Pipeline as Grain's documentation recommends ("Dataset basics", "Data mixing",
"Checkpointing"): per source ``MapDataset.source(...).shuffle(seed).repeat()`` (a global
shuffle per source; Grain reshuffles each epoch of a repeated shuffled dataset),
``MapDataset.mix(datasets, weights)`` (Grain's deterministic weighted interleave),
``.map(decode)``, ``.batch(2)``, ``.to_iter_dataset(ReadOptions(num_threads=2,
prefetch_buffer_size=...))``, ``.mp_prefetch(MultiprocessingOptions(num_workers=2))``;
checkpoint = the iterator's ``get_state()`` / ``set_state()``.  Batches are numpy (Grain
yields numpy); the loop gets them as tensors via ``torch.from_numpy`` (no copy).

Run: ``bench/peers/.venvs/grain/bin/python bench/peers/peer_grain.py MODE``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

NAME = "Grain"


def data_dir(seq):
    return os.path.join(C.OUT, "arrayrecord", str(seq))


def _write(path, rows):
    from array_record.python.array_record_module import ArrayRecordWriter

    w = ArrayRecordWriter(path, "group_size:1")
    for r in rows:
        w.write(r.tobytes())
    w.close()


def prepare(seq):
    import numpy as np

    d = data_dir(seq)
    if os.path.exists(os.path.join(d, "files2000", "f1999.array_record")):
        return
    os.makedirs(os.path.join(d, "files2000"), exist_ok=True)
    samples = C.all_samples(seq)
    for name, s in zip(C.NAMES, samples):
        _write(os.path.join(d, name + ".array_record"), s)
    for i, part in enumerate(np.array_split(np.concatenate(samples), 2000)):
        _write(os.path.join(d, "files2000", f"f{i:04d}.array_record"), part)


def _decode(rec):
    import numpy as np

    x = np.frombuffer(rec, dtype=np.uint16).astype(np.int64)
    return {"input_ids": x[:-1], "labels": x[1:]}


def dataset(seq, weights=C.WEIGHTS, files="4", rank=None, dp=None):
    import grain

    d = data_dir(seq)
    if files == "4":
        paths = [[os.path.join(d, n + ".array_record")] for n in C.NAMES]
    elif files == "1":
        paths = [[os.path.join(d, "kernel_docs.array_record")]]
    else:
        paths = [[os.path.join(d, "files2000", f"f{i:04d}.array_record") for i in range(2000)]]
    parts = [grain.MapDataset.source(grain.sources.ArrayRecordDataSource(p))
             .shuffle(seed=C.SEED + i).repeat() for i, p in enumerate(paths)]
    ds = parts[0] if len(parts) == 1 else grain.MapDataset.mix(parts, weights=weights)
    if dp is not None:  # a DP rank: Grain's sharding by slicing (docs "Sharding")
        ds = ds[rank::dp]
    ds = ds.map(_decode).batch(C.MICRO_BATCH)
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=32))
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))


def _pss_paths(n):
    return [os.path.join(C.pss_dir("arrayrecord"), f"s{i:04d}.array_record") for i in range(n)]


def pss_prepare(n):
    """The PSS column's n sources, one ArrayRecord file each."""
    paths = _pss_paths(n)
    if os.path.exists(paths[-1]):
        return
    os.makedirs(C.pss_dir("arrayrecord"), exist_ok=True)
    for p, s in zip(paths, C.pss_samples(n)):
        _write(p, s)


def pss_loader(n, rank, world):
    """One rank: the pipeline above over the n sources (weights 1 each), sliced
    ``[rank::world]``, ``mp_prefetch`` with 2 worker processes."""
    import grain

    parts = [grain.MapDataset.source(grain.sources.ArrayRecordDataSource([p]))
             .shuffle(seed=C.SEED + i).repeat() for i, p in enumerate(_pss_paths(n))]
    ds = grain.MapDataset.mix(parts, weights=[1.0] * n)[rank::world]
    ds = ds.map(_decode).batch(C.MICRO_BATCH)
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=32))
    return Iter(iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))))


class Iter:
    def __init__(self, it):
        import torch

        self.it, self.wrap = it, torch.from_numpy

    def __iter__(self):
        return self

    def __next__(self):
        b = next(self.it)
        return {k: self.wrap(v) for k, v in b.items()}


def loader(seq, weights=C.WEIGHTS, files="4"):
    return Iter(iter(dataset(seq, weights, files)))


def state(it):
    return it.it.get_state()


def resume(seq, st, weights=C.WEIGHTS):
    it = iter(dataset(seq, weights))
    it.set_state(st)
    return Iter(it)


def close(it):
    close_ = getattr(it.it, "close", None)
    if close_:
        close_()


def loader_dp(seq, rank, dp):
    return Iter(iter(dataset(seq, rank=rank, dp=dp)))


def resume_dp(seq, st, rank, dp):
    it = iter(dataset(seq, rank=rank, dp=dp))
    it.set_state(st)
    return Iter(it)


if __name__ == "__main__":
    C.main(sys.modules[__name__])
