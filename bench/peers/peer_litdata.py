#!/usr/bin/env python3
"""LitData in the peer table: ``litdata.optimize(..., item_loader=TokensLoader())`` chunks,
read by ``StreamingDataset(item_loader=TokensLoader(block_size=SEQ+1), shuffle=True)``,
mixed by ``CombinedStreamingDataset(weights=..., iterate_over_all=False)`` and delivered by
``StreamingDataLoader``.

This is LitData's documented recipe for LLM pre-training (README "Stream large token
datasets" / litgpt's pretraining data modules): documents' token ids are written
back-to-back into chunks and read as blocks of ``block_size`` tokens (concatenated, no
padding); ``CombinedStreamingDataset`` with weights for the mixture;
``StreamingDataLoader(batch_size=2, num_workers=2)`` (its default prefetch).  The chunks
hold each source's tokens in file order; ``chunk_size`` is a multiple of the block so that
blocks are the samples of common.py.

Run: ``bench/peers/.venvs/litdata/bin/python bench/peers/peer_litdata.py MODE``.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

NAME = "LitData"
_ROWS = {}


def data_dir(seq):
    return os.path.join(C.OUT, "litdata", str(seq))


def _rows(key):
    """The optimize function: yields the samples (uint16 token tensors) of one input."""
    import torch

    for row in _ROWS[key]:
        yield torch.from_numpy(row.astype("int32"))


def _write(out, key, rows, samples_per_chunk):
    from litdata import TokensLoader, optimize

    shutil.rmtree(out, ignore_errors=True)
    _ROWS[key] = rows
    optimize(fn=_rows, inputs=[key], output_dir=out, num_workers=1,
             chunk_size=samples_per_chunk * rows.shape[1], item_loader=TokensLoader(),
             start_method="fork", verbose=False)


def prepare(seq):
    import numpy as np

    d = data_dir(seq)
    if os.path.exists(os.path.join(d, "files2000", "index.json")):
        return
    samples = C.all_samples(seq)
    for name, s in zip(C.NAMES, samples):
        _write(os.path.join(d, name), name, s, 1 << 10)
    _write(os.path.join(d, "files2000"), "all", np.concatenate(samples), 4)


def loader(seq, weights=C.WEIGHTS, files="4", state=None):
    import torch
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
    from litdata import TokensLoader

    d = data_dir(seq)
    names = C.NAMES if files == "4" else ["kernel_docs" if files == "1" else "files2000"]
    sets = [StreamingDataset(os.path.join(d, n), item_loader=TokensLoader(block_size=seq + 1),
                             shuffle=True, seed=C.SEED, drop_last=True) for n in names]
    ds = sets[0] if len(sets) == 1 else CombinedStreamingDataset(
        sets, seed=C.SEED, weights=weights, iterate_over_all=False)

    def collate(rows):
        x = torch.stack(rows).long()
        return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

    dl = StreamingDataLoader(ds, batch_size=C.MICRO_BATCH, num_workers=2, collate_fn=collate,
                             persistent_workers=True)
    if state is not None:
        dl.load_state_dict(state)
    return Iter(dl)


def loader_env(seq, state=None):
    """One rank process of the resume-with-another-DP-size column: torch.distributed
    initialized (gloo, env://, as torchrun leaves it; LitData takes rank and world size
    from it), then the loader of the table, its ``StreamingDataLoader.state_dict`` loaded
    with ``load_state_dict``."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return loader(seq, state=state)


def _pss_dirs(n):
    return [os.path.join(C.pss_dir("litdata"), f"s{i:04d}") for i in range(n)]


def pss_prepare(n):
    """The PSS column's n sources, one ``litdata.optimize`` output each."""
    dirs = _pss_dirs(n)
    if os.path.exists(os.path.join(dirs[-1], "index.json")):
        return
    for i, (d, s) in enumerate(zip(dirs, C.pss_samples(n))):
        if not os.path.exists(os.path.join(d, "index.json")):
            _write(d, f"s{i}", s, 1 << 10)


def pss_loader(n, rank, world):
    """One rank process: torch.distributed initialized (gloo, env://, as torchrun
    leaves it; LitData takes rank and world size from it), CombinedStreamingDataset of
    the n StreamingDatasets (weights 1 each), StreamingDataLoader(num_workers=2)."""
    import torch
    import torch.distributed as dist
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
    from litdata import TokensLoader

    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world)
    sets = [StreamingDataset(d, item_loader=TokensLoader(block_size=C.PSS_SEQ + 1),
                             shuffle=True, seed=C.SEED, drop_last=True) for d in _pss_dirs(n)]
    ds = CombinedStreamingDataset(sets, seed=C.SEED, weights=[1.0 / n] * n,
                                  iterate_over_all=False)

    def collate(rows):
        x = torch.stack(rows).long()
        return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

    return Iter(StreamingDataLoader(ds, batch_size=C.MICRO_BATCH, num_workers=2,
                                    collate_fn=collate, persistent_workers=True))


class Iter:
    """Endless: the next epoch after one ends."""

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


if __name__ == "__main__":
    C.main(sys.modules[__name__])
