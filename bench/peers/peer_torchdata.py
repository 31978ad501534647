#!/usr/bin/env python3
"""torchdata's ``StatefulDataLoader`` in the peer table.

As torchdata's README recommends: a drop-in for ``torch.utils.data.DataLoader`` with
``state_dict()`` / ``load_state_dict()``.  Dataset: the four sources' samples (npy_data.py,
concatenated samples of seq_length+1 tokens, memory-mapped) as one map-style dataset; the
mixture is torch's ``WeightedRandomSampler`` (per-sample weight w_s / n_s, with
replacement: PyTorch's way to mix map-style sources by weight); ``batch_size=2,
num_workers=2`` (the machine's cores), ``prefetch_factor=2`` (the default),
``persistent_workers=True``.

Run: ``bench/peers/.venvs/torchdata/bin/python bench/peers/peer_torchdata.py MODE``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import npy_data as D  # noqa: E402

NO_DP = ("no: torch's WeightedRandomSampler has no rank / num_replicas and DistributedSampler has no weights, so this mixture cannot be split over DP ranks")
NAME = "torchdata StatefulDataLoader"
prepare = D.prepare


class Mixed:
    def __init__(self, seq, files, paths=None):
        self.parts = [D.Rows(p) for p in (paths or D.source_files(seq, files))]
        self.offsets = [0]
        for p in self.parts:
            self.offsets.append(self.offsets[-1] + len(p))

    def __len__(self):
        return self.offsets[-1]

    def __getitem__(self, i):
        for s, p in enumerate(self.parts):
            if i < self.offsets[s + 1]:
                return D.to_sample(p[i - self.offsets[s]])
        raise IndexError(i)


def make_loader(seq, weights=C.WEIGHTS, files="4"):
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = Mixed(seq, files)
    w = weights if files == "4" else [1.0]
    per = torch.cat([torch.full((len(p),), wi / len(p), dtype=torch.float64)
                     for p, wi in zip(ds.parts, w)])
    # num_samples: the sampler draws all indices when iteration starts (torch.multinomial),
    # so it is sized to the longest run here (10**8 took ~1 min and 800 MB at start-up)
    sampler = torch.utils.data.WeightedRandomSampler(
        per, num_samples=200_000, replacement=True,
        generator=torch.Generator().manual_seed(C.SEED))
    return StatefulDataLoader(ds, batch_size=C.MICRO_BATCH, sampler=sampler, num_workers=2,
                              prefetch_factor=2, persistent_workers=True)


pss_prepare = D.pss_prepare


def pss_loader(n, rank, world):
    """One rank's StatefulDataLoader over the n sources (weights 1 each), as above;
    torch's WeightedRandomSampler cannot be split over ranks, so each rank draws with a
    seed of its own."""
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = Mixed(C.PSS_SEQ, None, D.pss_files(n))
    per = torch.cat([torch.full((len(p),), 1.0 / len(p), dtype=torch.float64)
                     for p in ds.parts])
    sampler = torch.utils.data.WeightedRandomSampler(
        per, num_samples=200_000, replacement=True,
        generator=torch.Generator().manual_seed(C.SEED + rank))
    return Iter(StatefulDataLoader(ds, batch_size=C.MICRO_BATCH, sampler=sampler,
                                   num_workers=2, prefetch_factor=2,
                                   persistent_workers=True))


class Iter:
    """Keeps the StatefulDataLoader beside its iterator (its state is the loader's)."""

    def __init__(self, dl):
        self.dl, self.it = dl, iter(dl)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.it)


def loader(seq, weights=C.WEIGHTS, files="4"):
    return Iter(make_loader(seq, weights, files))


def state(it):
    return it.dl.state_dict()


def resume(seq, st, weights=C.WEIGHTS):
    dl = make_loader(seq, weights)
    dl.load_state_dict(st)
    return Iter(dl)


def close(it):
    del it.it


if __name__ == "__main__":
    C.main(sys.modules[__name__])
