#!/usr/bin/env python3
"""polyload in the peer table: ``polyload.Loader`` over the demo's four Megatron datasets.

Config: examples/pretrain_mix.yaml without its schedule (constant weights 0.4/0.3/0.2/0.1,
as the peers get), seq_length from ``--seq``, dp 4 served by one Loader in this process
(``ranks=[0, 1, 2, 3]``, ``next_batch(r)`` round robin, 16 micro-batches of 2 per step),
``threads: 2``, ``prefetch: 4``, ``packing: best_fit``, ``balance: greedy``.  Its data is
Megatron's .bin/.idx as ``make corpus`` wrote it (no conversion).

Run with the project's venv: ``.venv/bin/python bench/peers/peer_polyload.py MODE``.
"""
import copy
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

NAME = "polyload"
FILES_DIR = os.path.join(C.OUT, "polyload", "files2000")


def config(seq, weights=C.WEIGHTS, dp=4, files="4"):
    import yaml

    with open(C.EXAMPLE) as f:
        cfg = yaml.safe_load(f.read().split("\nschedule:", 1)[0])
    cfg.update(seq_length=seq, train_steps=1000000)
    cfg["topology"] = dict(cfg["topology"], dp=dp)
    if files == "1":
        cfg["sources"] = [dict(cfg["sources"][0], weight=1.0)]
    elif files == "2000":
        cfg["sources"] = [{"name": "all", "type": "megatron", "path": FILES_DIR, "weight": 1.0}]
    else:
        for s, w in zip(cfg["sources"], weights):
            s["weight"] = w
    return cfg


class RoundRobin:
    """All DP ranks' micro-batches of one Loader in step order (rank 0's first, ...)."""

    def __init__(self, loader, dp):
        self.loader, self.dp = loader, dp
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self):
        b = self.loader.next_batch(self.i % self.dp)
        self.i += 1
        if b is None:
            raise StopIteration
        return b


def loader(seq, weights=C.WEIGHTS, files="4", dp=4):
    import polyload

    pl = polyload.Loader(config(seq, weights, dp, files), rank=0, ranks=range(dp))
    return RoundRobin(pl, dp)


def close(it):
    it.loader.close()


def state(it):
    """The Loader's state, and which rank's micro-batch comes next in the round robin."""
    return {"loader": copy.deepcopy(it.loader.state_dict()), "next": it.i}


def resume(seq, st, weights=C.WEIGHTS, dp=4):
    it = loader(seq, weights, dp=dp)
    it.loader.load_state_dict(st["loader"])
    it.i = st["next"]
    return it


def prepare(seq):
    """The 2,000-file set of the start-up column: the four sources' documents, in order,
    dealt into 2,000 Megatron datasets (one source when opened as a directory)."""
    from polyload.prepare import NumpyIndexedWriter

    if os.path.exists(os.path.join(FILES_DIR, "f1999.idx")):
        return
    os.makedirs(FILES_DIR, exist_ok=True)
    docs = []
    for _, prefix, _ in C.SOURCES:
        tokens, lengths = C.read_megatron(prefix)
        ends = np.cumsum(lengths.astype(np.int64))
        docs += [tokens[e - n:e] for e, n in zip(ends, lengths)]
    per = -(-len(docs) // 2000)
    for i in range(2000):
        w = NumpyIndexedWriter(os.path.join(FILES_DIR, f"f{i:04d}.bin"), np.uint16)
        for d in docs[i * per:(i + 1) * per] or docs[-1:]:
            w.add_document(d)
        w.finalize(os.path.join(FILES_DIR, f"f{i:04d}.idx"))


def _pss_prefix(i):
    return os.path.join(C.pss_dir("megatron"), f"s{i:04d}")


def pss_prepare(n):
    """The PSS column's n sources as Megatron datasets (polyload's NumpyIndexedWriter),
    shared with megatron-core."""
    from polyload.prepare import NumpyIndexedWriter

    if os.path.exists(_pss_prefix(n - 1) + ".idx"):
        return
    os.makedirs(C.pss_dir("megatron"), exist_ok=True)
    for i, docs in enumerate(C.pss_docs(n)):
        w = NumpyIndexedWriter(_pss_prefix(i) + ".bin", np.uint16)
        for d in docs:
            w.add_document(d)
        w.finalize(_pss_prefix(i) + ".idx")


def pss_config(n, world):
    cfg = config(C.PSS_SEQ, dp=world)
    cfg["sources"] = [{"name": f"s{i:04d}", "type": "megatron", "path": _pss_prefix(i),
                       "weight": 1.0} for i in range(n)]
    return cfg


def pss_loader(n, rank, world):
    """One rank's Loader (one per trainer process, the rank given as torch.distributed
    would give it), the example's settings: threads 2, prefetch 4."""
    import warnings

    import polyload

    warnings.simplefilter("ignore")  # weights 1 each: "normalized to 1/n"
    return iter(polyload.Loader(pss_config(n, world), rank=rank))


class PieceIndex:
    """Segment (via cu_seqlens) -> id of the chunk it is: polyload splits a document into
    chunks at offsets 0, seq, 2 seq, ... (long_documents: split), each delivered whole."""

    def __init__(self, seq):
        from collections import Counter

        self.map = {}
        self.expected = [Counter() for _ in C.SOURCES]
        for i, (_, prefix, _) in enumerate(C.SOURCES):
            tokens, lengths = C.read_megatron(prefix)
            start = 0
            j = 0
            for n in lengths.tolist():
                for off in range(0, n, seq):
                    piece = tokens[start + off:start + min(n, off + seq)]
                    sid = self.map.setdefault(C.row_key(piece), i * C.SID_BASE + j)
                    self.expected[sid // C.SID_BASE][sid] += 1
                    j += 1
                start += n

    def ids(self, b):
        flat = np.asarray(b["input_ids"]).ravel()
        cu = np.asarray(b["cu_seqlens"])
        out = []
        for a, e in zip(cu[:-1], cu[1:]):
            seg = flat[a:e]
            if (seg == C.PAD_ID).all():
                continue  # padding at a sequence end
            out.append((self.map.get(C.row_key(seg), -1), int(e - a)))
        return out


def make_index(seq):
    return PieceIndex(seq)


def dp_resume(seq, k, n):
    """State after 8 whole steps of a dp-4 run, loaded into a dp-2 Loader (and dp 8); the
    next steps must hold the same chunks (the global sample order does not depend on dp;
    which rank gets which chunk may).  Also: a mid-step state into another dp."""
    steps_before, steps_after = 8, max(1, n // C.MB_PER_STEP)
    index = PieceIndex(seq)

    def step_sets(batches):
        return [sorted(s for b in batches[i * C.MB_PER_STEP:(i + 1) * C.MB_PER_STEP]
                       for s, _ in index.ids(b)) for i in range(len(batches) // C.MB_PER_STEP)]

    it = loader(seq)
    C.take(it, steps_before * C.MB_PER_STEP)
    st = state(it)
    ref = step_sets(C.take(it, steps_after * C.MB_PER_STEP))
    C.take(it, C.MB_PER_STEP // 2)
    mid = state(it)
    close(it)
    out = {"steps_compared": steps_after}
    for dp in (2, 8):
        it2 = resume(seq, st, dp=dp)
        got = step_sets(C.take(it2, steps_after * C.MB_PER_STEP))
        close(it2)
        out[f"dp4_to_dp{dp}_same_chunks"] = got == ref
    try:
        it3 = resume(seq, mid, dp=2)
        next(it3)
        close(it3)
        out["mid_step"] = "accepted"
    except Exception as e:  # noqa: BLE001 - reported in the table
        out["mid_step"] = f"{type(e).__name__}: {e}"[:200]
    ok = out["dp4_to_dp2_same_chunks"] and out["dp4_to_dp8_same_chunks"]
    out["result"] = "yes" if ok else "no"
    out["what_happened"] = (f"dp 4 -> 2 and 4 -> 8 at a step boundary: next {steps_after} steps "
                            f"hold the same chunks: {ok}; a mid-step state into dp 2: "
                            f"{out['mid_step']}")
    return out


if __name__ == "__main__":
    C.main(sys.modules[__name__])
