"""``packing: concat_chunk`` against megatron-core's GPTDataset, sample for sample, on a real
Megatron indexed dataset (Debian fortunes tokenized by ``polyload prepare``).

GPTDataset shuffles documents with its own NumPy RNG, polyload with its keyed permutation,
so the test gives both the same document order: it reads polyload's draw order from its
plans and writes a copy of the dataset (with megatron-core's own IndexedDatasetBuilder)
whose documents sit where GPTDataset's ``document_index`` will read them in that order.
Then GPTDataset's unshuffled sample ``j`` (``shuffle_index`` undone) is polyload's sequence
``j`` (step ``j // global_batch_size``): the same ``seq_length + 1`` window of the document
stream, with ``reset_position_ids``, ``reset_attention_mask`` and ``eod_mask_loss``
(polyload never trains across documents).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import yaml

import fortunes_corpus
import polyload
from polyload import ConfigWarning, _core

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("megatron.core")
    from megatron.core.datasets import indexed_dataset as mid
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import Split

S, G, STEPS = 128, 8, 12
EOD, PAD = 0, 1  # the corpus tokenizer's <|endoftext|> and <pad>


class _TokenizerIds:
    """What GPTDataset reads of a tokenizer: the special ids of the corpus's tokenizer.json."""

    def __init__(self, path):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        self.eod = tok.token_to_id("<|endoftext|>")
        self.pad = tok.token_to_id("<pad>")
        self.vocab_size = tok.get_vocab_size()
        self.unique_identifiers = {"class": "fortunes", "eod": self.eod, "pad": self.pad}


@pytest.fixture(scope="module")
def fortunes(tmp_path_factory):
    return fortunes_corpus.build(tmp_path_factory.mktemp("fortunes"))


def _config(prefix, **kw):
    cfg = {"seed": 11, "seq_length": S, "global_batch_size": G, "micro_batch_size": 4,
           "train_steps": STEPS, "pad_id": PAD, "packing": "concat_chunk",
           "topology": {"dp": 1}, "threads": 1,
           "sources": [{"name": "tech", "type": "megatron", "path": prefix, "weight": 1.0}]}
    cfg.update(kw)
    return cfg


def _draw_order(cfg, n):
    """Documents in polyload's stream order over its first epoch (from the plans)."""
    planner = _core.Planner.create(_core.Config.parse_string(yaml.safe_dump(cfg)))
    order = []
    while len(order) < n:
        plan = planner.next()
        chunks = np.asarray(plan["chunks"])
        offs = np.asarray(plan["seq_offsets"])
        for q in range(plan["n_sequences"]):
            for source, index, offset, length, flags in chunks[offs[q]:offs[q + 1]]:
                if offset == 0 and len(order) < n:
                    order.append(int(index))
    assert sorted(order) == list(range(n))  # one epoch: every document once
    return order


def _gpt_dataset(prefix, tokenizer, num_samples):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = GPTDatasetConfig(random_seed=1234, sequence_length=S, blend=([prefix], None),
                               split="100,0,0", tokenizer=tokenizer, reset_position_ids=True,
                               reset_attention_mask=True, eod_mask_loss=True,
                               create_attention_mask=False, path_to_cache=None)
        ds = mid.IndexedDataset(prefix)
        return GPTDataset(ds, prefix, np.arange(len(ds), dtype=np.int32), num_samples,
                          Split.train, cfg)


def test_concat_chunk_equals_gpt_dataset(fortunes, tmp_path):
    prefix = fortunes["prefixes"]["tech"]
    tokenizer = _TokenizerIds(fortunes["tokenizer"])
    assert (tokenizer.eod, tokenizer.pad) == (EOD, PAD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        orig = mid.IndexedDataset(prefix)
    n = len(orig)
    assert int(np.asarray(orig.sequence_lengths).sum()) > (STEPS * G + 1) * S  # one epoch
    cfg = _config(prefix)
    order = _draw_order(cfg, n)

    # GPTDataset's document order for this n and seed, read from GPTDataset itself.
    perm = np.asarray(_gpt_dataset(prefix, tokenizer, STEPS * G).document_index)
    assert sorted(perm.tolist()) == list(range(n))
    # A copy whose document at perm[j] is polyload's j-th document.
    copy = str(tmp_path / "tech_reordered")
    at = np.empty(n, dtype=np.int64)
    at[perm] = np.asarray(order)
    b = mid.IndexedDatasetBuilder(mid.get_bin_path(copy), dtype=orig.index.dtype)
    for j in range(n):
        b.add_item(torch.from_numpy(np.asarray(orig[int(at[j])]).astype(orig.index.dtype)))
        b.end_document()
    b.finalize(mid.get_idx_path(copy))
    gpt = _gpt_dataset(copy, tokenizer, STEPS * G)
    np.testing.assert_array_equal(np.asarray(gpt.document_index), perm)
    unshuffle = np.argsort(np.asarray(gpt.shuffle_index))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        loader = polyload.Loader(cfg, rank=0)
    rows = []
    with loader:
        for batch in loader:
            for r in range(batch["input_ids"].shape[0]):
                rows.append({k: batch[k][r].numpy() for k in
                             ("input_ids", "labels", "loss_mask", "position_ids")}
                            | {"cu": batch["cu_seqlens"].numpy(), "row": r})
    assert len(rows) == STEPS * G
    ends_inside = 0
    for j, row in enumerate(rows):
        want = gpt[int(unshuffle[j])]
        tokens = want["tokens"].numpy()
        np.testing.assert_array_equal(row["input_ids"], tokens, err_msg=f"sample {j}")
        np.testing.assert_array_equal(row["loss_mask"], want["loss_mask"].numpy(),
                                      err_msg=f"sample {j}")
        np.testing.assert_array_equal(row["position_ids"], want["position_ids"].numpy(),
                                      err_msg=f"sample {j}")
        m = row["loss_mask"] == 1
        np.testing.assert_array_equal(row["labels"][m], want["labels"].numpy()[m],
                                      err_msg=f"sample {j}")
        assert (row["labels"][~m] == -100).all()
        # cu_seqlens: a segment ends after each end-of-document token and at the row's end
        # (reset_attention_mask), over the micro-batch's flattened rows.
        base = row["row"] * S
        cu = row["cu"][(row["cu"] > base) & (row["cu"] <= base + S)] - base
        want_cu = sorted(set((np.flatnonzero(tokens == EOD) + 1).tolist()) | {S})
        assert cu.tolist() == want_cu, f"sample {j}"
        ends_inside += int(tokens[-1] != EOD)
    assert ends_inside > 0  # some rows end inside a document: their last label is kept
