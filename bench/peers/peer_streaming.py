#!/usr/bin/env python3
"""MosaicML Streaming in the peer table: MDS shards written by ``MDSWriter``, read by
``StreamingDataset(streams=[Stream(local=..., proportion=w), ...])`` through
``StreamingDataLoader``.

Configured as Streaming's documentation recommends for LLM pre-training (docs "Main
concepts", "Mixing data sources", "Dataloader"): one ``Stream`` per source with
``proportion`` (its weight), ``shuffle=True`` (default ``py1e`` shuffle), ``batch_size`` =
the per-device batch (2), ``StreamingDataLoader(num_workers=2, prefetch_factor=2,
persistent_workers=True)`` (8 workers are recommended per GPU; this machine has 2 cores).
MDS column ``tokens``: ``ndarray:uint16:SEQ+1`` (concatenated samples, uncompressed).

mosaicml-streaming 0.13.0 requires torchvision, and ``import streaming`` imports
``streaming.vision`` (CIFAR/ImageNet datasets) which imports it; PyPI's torchvision
0.28.0 is built against CUDA torch and fails to load with the CPU torch 2.13.0
(``libc10_cuda.so: cannot open shared object file``, then ``RuntimeError: operator
torchvision::nms does not exist``).  The harness therefore registers an empty
``streaming.vision`` module before importing streaming; nothing measured here uses it.

Run: ``bench/peers/.venvs/streaming/bin/python bench/peers/peer_streaming.py MODE``.
"""
import os
import shutil
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

NAME = "MosaicML Streaming"
sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))


def data_dir(seq):
    return os.path.join(C.OUT, "mds", str(seq))


def _write(out, samples_list, size_limit=1 << 26):
    from streaming import MDSWriter

    seq1 = samples_list[0].shape[1]
    shutil.rmtree(out, ignore_errors=True)
    with MDSWriter(out=out, columns={"tokens": f"ndarray:uint16:{seq1}"},
                   compression=None, size_limit=size_limit) as w:
        for s in samples_list:
            for row in s:
                w.write({"tokens": row})


def prepare(seq):
    import numpy as np

    d = data_dir(seq)
    if os.path.exists(os.path.join(d, "files2000", "index.json")):
        return
    samples = C.all_samples(seq)
    for name, s in zip(C.NAMES, samples):
        _write(os.path.join(d, name), [s])
    alls = np.concatenate(samples)
    # shards of 4 samples: ceil(n / 4) shard files (1,939 at seq 2048)
    per = 5 * (seq + 1) * 2
    _write(os.path.join(d, "files2000"), [alls], size_limit=per)


def before_ranks():
    """Before the rank processes of a run start (common.dp_change_multiproc): clear the
    shared memory an earlier run left, once, not in each rank."""
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()


def loader_env(seq, state=None):
    """One rank process of the resume-with-another-DP-size column: Streaming takes rank
    and world size from the environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE);
    the loader of the table, its state from ``StreamingDataLoader.state_dict`` (global:
    ``num_samples_yielded * world size``) loaded with ``load_state_dict``."""
    return loader(seq, state=state, clean=False)


def loader(seq, weights=C.WEIGHTS, files="4", state=None, clean=True):
    from streaming import Stream, StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    if clean:
        clean_stale_shared_memory()
    d = data_dir(seq)
    if files == "4":
        streams = [Stream(local=os.path.join(d, n), proportion=w)
                   for n, w in zip(C.NAMES, weights)]
    else:
        streams = [Stream(local=os.path.join(d, "kernel_docs" if files == "1" else "files2000"))]
    ds = StreamingDataset(streams=streams, shuffle=True, shuffle_seed=C.SEED,
                          batch_size=C.MICRO_BATCH)

    def collate(rows):
        import numpy as np
        import torch

        x = torch.from_numpy(np.stack([r["tokens"] for r in rows]).astype(np.int64))
        return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

    dl = StreamingDataLoader(ds, batch_size=C.MICRO_BATCH, num_workers=2, prefetch_factor=2,
                             persistent_workers=True, collate_fn=collate)
    if state is not None:
        dl.load_state_dict(state)
    return Iter(dl)


def _pss_dirs(n):
    return [os.path.join(C.pss_dir("mds"), f"s{i:04d}") for i in range(n)]


def pss_prepare(n):
    """The PSS column's n sources, one MDS directory each (MDSWriter); also clears
    Streaming's shared memory left by an earlier run (the runner calls it before each
    set of ranks)."""
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    dirs = _pss_dirs(n)
    if os.path.exists(os.path.join(dirs[-1], "index.json")):
        return
    for d, s in zip(dirs, C.pss_samples(n)):
        _write(d, [s])


def pss_loader(n, rank, world):
    """One rank process (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE in the
    environment, as Streaming reads them): one Stream per source (equal sizes, so equal
    weights), StreamingDataset + StreamingDataLoader as above."""
    from streaming import Stream, StreamingDataLoader, StreamingDataset

    streams = [Stream(local=d) for d in _pss_dirs(n)]
    ds = StreamingDataset(streams=streams, shuffle=True, shuffle_seed=C.SEED,
                          batch_size=C.MICRO_BATCH)

    def collate(rows):
        import numpy as np
        import torch

        x = torch.from_numpy(np.stack([r["tokens"] for r in rows]).astype(np.int64))
        return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

    return Iter(StreamingDataLoader(ds, batch_size=C.MICRO_BATCH, num_workers=2,
                                    prefetch_factor=2, persistent_workers=True,
                                    collate_fn=collate))


class Iter:
    """Endless: the next epoch after one ends (as a trainer's epoch loop does)."""

    def __init__(self, dl):
        self.dl, self.it = dl, iter(dl)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.dl)
            return next(self.it)


def state(it):
    return it.dl.state_dict()


def resume(seq, st, weights=C.WEIGHTS):
    return loader(seq, weights, state=st)


def close(it):
    del it.it
    it.dl = None


if __name__ == "__main__":
    C.main(sys.modules[__name__])
