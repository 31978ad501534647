#!/usr/bin/env python3
"""``torchdata.nodes`` with ``MultiNodeWeightedSampler`` in the peer table.

The pipeline of torchdata.nodes' documentation ("Migrating to torchdata.nodes from
torch.utils.data", "MultiNodeWeightedSampler" examples): per source a
``SamplerWrapper(RandomSampler)`` of sample indices (a stateful, per-epoch shuffle), the
four mixed by ``MultiNodeWeightedSampler(weights=..., seed=...)`` (stop criterion
CYCLE_FOREVER: an exhausted source starts its next epoch), then
``ParallelMapper(fetch + to tensors, num_workers=2, method="thread")`` (the documented
choice when the map function releases the GIL: numpy memmap copies), ``Batcher(2)``,
``Mapper(collate)``, ``Prefetcher(2)`` and ``Loader``, whose ``state_dict`` is the
checkpoint.  Data: npy_data.py (concatenated samples of seq_length+1 tokens).

Run: ``bench/peers/.venvs/torchdata/bin/python bench/peers/peer_torchdata_nodes.py MODE``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import npy_data as D  # noqa: E402

NAME = "torchdata.nodes"
prepare = D.prepare


def make_loader(seq, weights=C.WEIGHTS, files="4", rank=None, dp=None, paths=None):
    import torch
    import torchdata.nodes as tn
    from torch.utils.data import default_collate

    parts = [D.Rows(p) for p in (paths or D.source_files(seq, files))]
    if paths:  # the PSS column's sources, weights 1 each
        names, w = [f"s{i:04d}" for i in range(len(paths))], [1.0] * len(paths)
    else:
        names = C.NAMES if files == "4" else ["all"]
        w = weights if files == "4" else [1.0]
    nodes = {}
    for i, (name, p) in enumerate(zip(names, parts)):
        if dp is None:
            g = torch.Generator().manual_seed(C.SEED + i)
            smp = torch.utils.data.RandomSampler(range(len(p)), generator=g)
        else:  # a DP rank: its shard of each source (torch's DistributedSampler)
            smp = torch.utils.data.DistributedSampler(range(len(p)), num_replicas=dp,
                                                      rank=rank, shuffle=True, seed=C.SEED + i)
        idx = tn.SamplerWrapper(smp)
        nodes[name] = tn.Mapper(idx, lambda j, i=i: (i, j))
    mixed = tn.MultiNodeWeightedSampler(nodes, dict(zip(names, w)),
                                        stop_criteria="CYCLE_FOREVER", seed=C.SEED,
                                        rank=rank, world_size=dp)
    node = tn.ParallelMapper(mixed, lambda ij: D.to_sample(parts[ij[0]][ij[1]]),
                             num_workers=2, method="thread")
    node = tn.Batcher(node, batch_size=C.MICRO_BATCH)
    node = tn.Mapper(node, default_collate)
    node = tn.Prefetcher(node, prefetch_factor=2)
    return tn.Loader(node)


class Iter:
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


pss_prepare = D.pss_prepare


def pss_loader(n, rank, world):
    """One rank: per-source DistributedSampler shards and MultiNodeWeightedSampler(rank,
    world_size) over the n sources, as above."""
    return Iter(make_loader(C.PSS_SEQ, rank=rank, dp=world, paths=D.pss_files(n)))


def loader_dp(seq, rank, dp):
    return Iter(make_loader(seq, rank=rank, dp=dp))


def resume_dp(seq, st, rank, dp):
    dl = make_loader(seq, rank=rank, dp=dp)
    dl.load_state_dict(st)
    return Iter(dl)


if __name__ == "__main__":
    C.main(sys.modules[__name__])
