#!/usr/bin/env python3
"""megatron-core (the project venv's release) in the peer table.

``BlendedMegatronDatasetBuilder(GPTDataset, ...)`` over the demo's four Megatron datasets
(the same .bin/.idx polyload reads), ``blend`` = the weights, ``sequence_length`` =
``--seq``, Megatron's default flags (as bench/embedded/throughput.py: create_attention_mask=False,
reset_position_ids=False, eod_mask_loss=False; GPTDataset concatenates shuffled documents
into samples of seq_length+1 tokens: concatenated, no padding), tokenizer ids of
data/tokenizer.json.  Delivered as Megatron-LM's pretraining loop does: a
``torch.utils.data.DataLoader(num_workers=2, pin_memory=False)`` whose batch sampler is
Megatron-LM's ``MegatronPretrainingSampler`` logic (sequential over the blended index from
``consumed_samples``, each DP rank its slice of each global batch; megatron-core has no
sampler of its own, so the 20 lines are reproduced here).  The checkpoint is
``consumed_samples``, as Megatron-LM saves it.

Run: ``.venv/bin/python bench/peers/peer_megatron.py MODE``.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common as C  # noqa: E402

NAME = "megatron-core"
N_SAMPLES = 40000  # blended samples built (enough for every mode)


def prepare(seq):
    """The 2,000-file set is polyload's (Megatron's format): peer_polyload.prepare."""
    import peer_polyload

    peer_polyload.prepare(seq)


def build(seq, weights=C.WEIGHTS, files="4", n=N_SAMPLES):
    import torch
    from _common import EodTokenizer, init_torch_distributed, megatron_quiet
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    megatron_quiet()
    init_torch_distributed()
    torch.set_num_threads(1)
    if files == "4":
        blend = ([os.path.join(C.ROOT, p) for _, p, _ in C.SOURCES], list(weights))
    elif files == "1":
        blend = ([os.path.join(C.ROOT, C.SOURCES[0][1])], None)
    else:
        import peer_polyload
        d = peer_polyload.FILES_DIR
        # weight 1 each: with None (size-proportional) BlendedDataset asserts, as the files
        # of short fortunes hold fewer than seq_length + 1 tokens (0 samples, weight 0)
        blend = ([os.path.join(d, f"f{i:04d}") for i in range(2000)], [1.0] * 2000)
    tag = "-".join(f"{w:g}" for w in weights) if files == "4" else files
    cache = os.path.join(C.OUT, "megatron_cache", f"{seq}-{tag}")
    cfg = GPTDatasetConfig(random_seed=C.SEED, sequence_length=seq, blend=blend,
                           split="100,0,0", path_to_cache=cache, tokenizer=EodTokenizer(),
                           reset_position_ids=False, reset_attention_mask=False,
                           eod_mask_loss=False, create_attention_mask=False)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [n, 0, 0], lambda: True,
                                                cfg).build()
    return train


def build_pss(n, samples=4096):
    """BlendedDataset of the PSS column's n GPTDatasets (weights 1 each), index cache
    under bench/out/peers/megatron_cache/pss-N (built by pss_prepare, loaded by ranks)."""
    import torch
    import peer_polyload
    from _common import EodTokenizer, init_torch_distributed, megatron_quiet
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    megatron_quiet()
    init_torch_distributed()
    torch.set_num_threads(1)
    blend = ([peer_polyload._pss_prefix(i) for i in range(n)], [1.0] * n)
    cfg = GPTDatasetConfig(random_seed=C.SEED, sequence_length=C.PSS_SEQ, blend=blend,
                           split="100,0,0",
                           path_to_cache=os.path.join(C.OUT, "megatron_cache", f"pss-{n}"),
                           tokenizer=EodTokenizer(), reset_position_ids=False,
                           reset_attention_mask=False, eod_mask_loss=False,
                           create_attention_mask=False)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [samples, 0, 0], lambda: True,
                                                cfg).build()
    return train


def pss_prepare(n):
    import peer_polyload

    peer_polyload.pss_prepare(n)
    for k in (30, n):  # the index caches, once (as a first launch writes them)
        build_pss(k)


def pss_loader(n, rank, world):
    """One rank's DataLoader (num_workers=2) over the BlendedDataset, Megatron-LM's
    sampler logic for DP rank ``rank`` of ``world``."""
    return Iter(build_pss(n), rank=rank, dp=world)


class PretrainingSampler:
    """Megatron-LM's MegatronPretrainingSampler: sequential micro-batches from
    consumed_samples; rank r of dp takes [r*mb, (r+1)*mb) of each dp*mb indices."""

    def __init__(self, total, consumed, mb, rank, dp):
        self.total, self.consumed, self.mb, self.rank, self.dp = total, consumed, mb, rank, dp

    def __iter__(self):
        batch = []
        for i in range(self.consumed, self.total):
            batch.append(i)
            if len(batch) == self.mb * self.dp:
                yield batch[self.rank * self.mb:(self.rank + 1) * self.mb]
                batch = []

    def __len__(self):
        return (self.total - self.consumed) // (self.mb * self.dp)


class Iter:
    def __init__(self, ds, consumed=0, rank=0, dp=1):
        import torch

        self.ds, self.consumed, self.dp = ds, consumed, dp
        self.dl = torch.utils.data.DataLoader(
            ds, batch_sampler=PretrainingSampler(len(ds), consumed, C.MICRO_BATCH, rank, dp),
            num_workers=2, pin_memory=False)
        self.it = iter(self.dl)

    def __iter__(self):
        return self

    def __next__(self):
        b = next(self.it)
        self.consumed += C.MICRO_BATCH * self.dp
        return {"input_ids": b["tokens"], "labels": b["labels"], "loss_mask": b["loss_mask"],
                "position_ids": b["position_ids"]}


def loader(seq, weights=C.WEIGHTS, files="4"):
    return Iter(build(seq, weights, files))


def state(it):
    return {"consumed_samples": it.consumed}


def resume(seq, st, weights=C.WEIGHTS):
    return Iter(build(seq, weights), consumed=st["consumed_samples"])


def close(it):
    del it.it


class BlendIndex:
    """Source of each delivered sample: the BlendedDataset's own dataset_index (the
    sampler is sequential, so delivered micro-batch i holds samples 2i, 2i+1)."""

    def __init__(self, seq):
        self.ds = build(seq)
        self.next = 0

    def ids(self, b):
        out = []
        for _ in range(b["input_ids"].shape[0]):
            src = int(self.ds.dataset_index[self.next])
            out.append((src * C.SID_BASE + int(self.ds.dataset_sample_index[self.next]),
                        b["input_ids"].shape[1]))
            self.next += 1
        return out


def make_index(seq):
    return BlendIndex(seq)


def reweight_check(seq, k, n):
    """Weight change at resume: megatron-core samples are shuffled documents concatenated,
    so they have no id to compare; compared instead are the whole documents (EOD 0 on
    both sides inside a sample) delivered in the 100 micro-batches after the resume
    against those of the K before it.  No source completes an epoch in that window, so a
    repeated document is a repetition (loss is not observable this way)."""
    import numpy as np

    def docs(batches):
        out = []
        for b in batches:
            for row in np.asarray(b["input_ids"]):
                cut = np.flatnonzero(row == 0)
                for a, e in zip(cut[:-1], cut[1:]):
                    if e - a > 8:
                        out.append(C.row_key(row[a + 1:e + 1]))
        return out

    it = loader(seq)
    before = C.take(it, k)
    st = state(it)
    ref = C.take(it, n)
    close(it)
    it2 = resume(seq, st, weights=C.REWEIGHTS)
    after = C.take(it2, n)
    close(it2)
    seen = set(docs(before))
    got = docs(after)
    rep = sum(1 for d in got if d in seen)
    ctl = sum(1 for d in docs(ref) if d in seen)  # same, uninterrupted and unchanged weights
    return {"whole_documents_after": len(got), "repeated_from_before": rep,
            "control_without_resume_repeated": ctl,
            "result": "yes" if rep <= ctl else "no",
            "what_happened": (f"{rep} of the {len(got)} whole documents in the {n} micro-batches "
                              f"after the resume with new weights were delivered in the {k} "
                              "before it (the blended index is rebuilt for the new weights, so "
                              f"consumed_samples points into another order); uninterrupted: {ctl}")}


def dp_resume(seq, k, n):
    """consumed_samples after 8 steps at dp 4, then dp 2: the samples of the next steps
    (all ranks together) must be those of the uninterrupted dp-4 run."""
    ds = build(seq)
    per_step = C.GLOBAL_BATCH
    steps = max(1, n // C.MB_PER_STEP)
    consumed = 8 * per_step

    def step_sets(dp):
        sets = []
        for s in range(steps):
            idx = []
            for r in range(dp):
                smp = PretrainingSampler(len(ds), consumed + s * per_step, C.MICRO_BATCH, r, dp)
                it = iter(smp)
                for _ in range(per_step // (C.MICRO_BATCH * dp)):
                    idx += next(it)
            sets.append(sorted(idx))
        return sets

    ok = step_sets(4) == step_sets(2)
    return {"result": "yes" if ok else "no",
            "what_happened": f"consumed_samples is global: dp 4 -> 2, next {steps} steps hold the "
                             f"same samples: {ok} (the sampler's index arithmetic, no data read)"}


if __name__ == "__main__":
    mod = sys.modules[__name__]
    if len(sys.argv) > 1 and sys.argv[1] == "reweight":
        import json
        k = int(sys.argv[sys.argv.index("--k") + 1]) if "--k" in sys.argv else 128
        print(json.dumps(dict(peer=NAME, mode="reweight", seq=2048, **reweight_check(2048, k, 100))))
    else:
        C.main(mod)
