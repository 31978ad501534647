"""polyload.megatron against the real megatron-core (CPU): PackedSeqParams built from real
batches, the CP layout that megatron-core's THD code expects (global padded offsets), the
argument check and the loader state saved next to a Megatron checkpoint."""

import argparse
import warnings

import numpy as np
import pytest

import polyload
from polyload import ConfigError, ConfigWarning

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("megatron.core")
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.rerun_state_machine import RerunDataIterator
    from megatron.core.utils import get_thd_batch_on_this_cp_rank
    from megatron.core.models.common.embeddings.rope_utils import (
        _get_thd_freqs_on_this_cp_rank,
    )

from polyload import megatron as plm  # noqa: E402


@pytest.fixture(autouse=True)
def _no_world(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)


def _loader(cfg, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return polyload.Loader(cfg, **kw)


def _segments(cu):
    cu = cu.tolist()
    return list(zip(cu[:-1], cu[1:]))


def test_batches_and_packed_seq_params_cp1(corpus):
    cfg = corpus.config(topology={"dp": 1}, train_steps=3)
    S, rows = corpus.seq_length, 2
    with plm.MegatronIterator(_loader(cfg), device="cpu") as it:
        batches = list(it)
    assert len(batches) == 3 * 8 // rows
    for m in batches:
        assert set(m) == {"tokens", "labels", "loss_mask", "position_ids", "attention_mask",
                          "packed_seq_params"}
        assert m["attention_mask"] is None
        tokens, labels, mask, pos = m["tokens"], m["labels"], m["loss_mask"], m["position_ids"]
        assert tokens.shape == (1, rows * S) and tokens.dtype == torch.int64
        assert labels.shape == mask.shape == pos.shape == (1, rows * S)
        assert mask.dtype == torch.float32 and pos.dtype == torch.int64
        p = m["packed_seq_params"]
        assert isinstance(p, PackedSeqParams) and p.qkv_format == "thd"
        cu = p.cu_seqlens_q
        assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == rows * S
        for t in (p.cu_seqlens_kv, p.cu_seqlens_q_padded, p.cu_seqlens_kv_padded):
            assert torch.equal(t, cu)
        lens = (cu[1:] - cu[:-1]).tolist()
        assert p.max_seqlen_q == p.max_seqlen_kv == max(lens)
        # Row boundaries are segment boundaries (rows are laid end to end).
        assert S in cu.tolist()
        t, lab, msk, ps = tokens[0].numpy(), labels[0].numpy(), mask[0].numpy(), pos[0].numpy()
        for a, b in _segments(cu):
            np.testing.assert_array_equal(ps[a:b], np.arange(b - a))  # reset_position_ids
        # Shifted labels (Megatron convention): the next token of the document, which in
        # the fixture is the token's value + 1; -100 exactly where there is no loss.
        on = msk == 1
        np.testing.assert_array_equal(lab[on], t[on] + 1)
        assert np.all(lab[~on] == -100)
        # megatron-core's own THD builder gives the same PackedSeqParams from our offsets.
        _, ref = get_thd_batch_on_this_cp_rank(
            {"tokens": tokens, "labels": labels, "loss_mask": mask, "position_ids": pos},
            cu, cu, torch.tensor([max(lens)]), cp_size=1, cp_rank=0)
        for f in ("qkv_format", "max_seqlen_q", "max_seqlen_kv"):
            assert getattr(ref, f) == getattr(p, f)
        for f in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded",
                  "cu_seqlens_kv_padded"):
            assert torch.equal(getattr(ref, f), getattr(p, f))


def test_context_parallel_global_padded_offsets(corpus):
    """cp=2: each CP rank's cu_seqlens times cp are the global padded offsets, the same on
    both ranks; reassembling the two ranks' pieces as Transformer Engine's THD layout does
    (rank i holds pieces i and 2cp-1-i of each segment) gives whole segments with positions
    0..L-1; megatron-core's THD RoPE assigns each local token polyload's position_id."""
    cp, S, rows = 2, corpus.seq_length, 2
    cfg = corpus.config(topology={"dp": 1, "cp": cp}, global_batch_size=4, train_steps=4)
    loader = _loader(cfg, rank=0, ranks=[0, 1])
    assert [loader.config.rank_info(r)["cp_rank"] for r in (0, 1)] == [0, 1]
    its = [plm.MegatronIterator(loader, rank=r, device="cpu") for r in (0, 1)]
    freqs = torch.arange(4 * S, dtype=torch.float32).view(-1, 1, 1, 1)
    n = 0
    while True:
        raw = [loader.next_batch(r) for r in (0, 1)]
        if raw[0] is None:
            assert raw[1] is None
            break
        n += 1
        ms = [it.convert(b) for it, b in zip(its, raw)]
        local_cu = [b["cu_seqlens"] for b in raw]
        glob = [m["packed_seq_params"].cu_seqlens_q_padded for m in ms]
        assert torch.equal(glob[0], glob[1])  # global offsets: the same on every CP rank
        for r in (0, 1):
            assert torch.equal(glob[r], local_cu[r] * cp)
            assert ms[r]["tokens"].shape == (1, rows * S // cp)
            assert ms[r]["packed_seq_params"].max_seqlen_q == raw[r]["max_seqlen"] * cp
        g = glob[0]
        assert g[-1] == rows * S
        lens = (g[1:] - g[:-1]).tolist()
        assert all(L % (2 * cp) == 0 for L in lens)
        # Reassemble every segment from the two ranks' pieces.
        tok = [m["tokens"][0].numpy() for m in ms]
        pos = [m["position_ids"][0].numpy() for m in ms]
        for k, (a, b) in enumerate(_segments(g)):
            L, piece = b - a, (b - a) // (2 * cp)
            full_t = np.empty(L, dtype=np.int64)
            full_p = np.empty(L, dtype=np.int64)
            for r in (0, 1):
                lo = a // cp
                for h, j in enumerate((r, 2 * cp - 1 - r)):
                    src = slice(lo + h * piece, lo + (h + 1) * piece)
                    full_t[j * piece:(j + 1) * piece] = tok[r][src]
                    full_p[j * piece:(j + 1) * piece] = pos[r][src]
            np.testing.assert_array_equal(full_p, np.arange(L))
            real = full_t != cfg.get("pad_id", 0)
            nreal = int(real.sum())
            assert real[:nreal].all()  # the document, then its padding
            if nreal:
                assert L - nreal < 2 * cp  # padding to a multiple of 2*cp only
                np.testing.assert_array_equal(np.diff(full_t[:nreal]), 1)
        # megatron-core's THD RoPE: it divides the global offsets by cp, splits this rank's
        # tokens by them and takes the frequencies of pieces r and 2cp-1-r.
        for r in (0, 1):
            seqlens = ((g[1:] - g[:-1]) // cp).tolist()
            assert sum(seqlens) == len(pos[r])
            x = torch.split(torch.zeros(len(pos[r]), 1, 1), seqlens)
            got = torch.cat([_get_thd_freqs_on_this_cp_rank(r, cp, xi, freqs) for xi in x])
            np.testing.assert_array_equal(got.view(-1).long().numpy(), pos[r])
            # The per-rank offsets themselves would not split this rank's tokens.
            assert sum(((local_cu[r][1:] - local_cu[r][:-1]) // cp).tolist()) != len(pos[r])
    assert n == 4 * 4 // rows
    loader.close()


def test_get_batch_through_rerun_iterator(corpus):
    cfg = corpus.config(topology={"dp": 1}, train_steps=2)
    ref = [polyload_batch for polyload_batch in _loader(cfg)]
    it = RerunDataIterator(plm.MegatronIterator(cfg, device="cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        for b in ref:
            tokens, labels, loss_mask, attention_mask, position_ids, psp = plm.get_batch(it)
            assert attention_mask is None
            assert torch.equal(tokens, b["input_ids"].reshape(1, -1))
            assert torch.equal(labels, b["labels"].reshape(1, -1))
            assert torch.equal(loss_mask, b["loss_mask"].reshape(1, -1))
            assert torch.equal(position_ids, b["position_ids"].reshape(1, -1))
            assert torch.equal(psp.cu_seqlens_q, b["cu_seqlens"])
        with pytest.raises(StopIteration):
            plm.get_batch(it)


def _args(**over):
    a = dict(seq_length=64, global_batch_size=8, micro_batch_size=2, seed=1234,
             train_iters=12, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
             context_parallel_size=1, data_parallel_size=2, rampup_batch_size=None,
             eod_mask_loss=True, reset_position_ids=True, reset_attention_mask=True)
    a.update(over)
    return argparse.Namespace(**a)


def test_check_args(corpus):
    cfg = corpus.config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # agreeing arguments: no warning either
        warnings.simplefilter("ignore", ConfigWarning)
        plm.check_args(_args(), cfg)
    cases = [
        (dict(seq_length=4096), "Megatron --seq-length is 4096 but polyload seq_length is 64"),
        (dict(global_batch_size=16),
         "Megatron --global-batch-size is 16 but polyload global_batch_size is 8"),
        (dict(micro_batch_size=1),
         "Megatron --micro-batch-size is 1 but polyload micro_batch_size is 2"),
        (dict(seed=1), "Megatron --seed is 1 but polyload seed is 1234"),
        (dict(train_iters=13),
         "Megatron --train-iters is 13 but polyload train_steps is 12"),
        (dict(tensor_model_parallel_size=2),
         "Megatron --tensor-model-parallel-size is 2 but polyload topology.tp is 1"),
        (dict(pipeline_model_parallel_size=4),
         "Megatron --pipeline-model-parallel-size is 4 but polyload topology.pp is 1"),
        (dict(context_parallel_size=2),
         "Megatron --context-parallel-size is 2 but polyload topology.cp is 1"),
        (dict(data_parallel_size=4), "data_parallel_size (world size / (tp*pp*cp)) is 4 but "
                                     "polyload topology.dp is 2"),
        (dict(rampup_batch_size=[4, 4, 100]), "--rampup-batch-size"),
        (dict(padded_vocab_size=0), "polyload pad_id 0 is outside Megatron's vocabulary "
                                    "(padded_vocab_size 0)"),
    ]
    for over, msg in cases:
        with pytest.raises(ConfigError) as e:
            plm.check_args(_args(**over), cfg)
        assert msg in e.value.message, (over, e.value.message)
    # Both problems are named at once.
    with pytest.raises(ConfigError, match="seq-length is 128.*seed is 7"):
        plm.check_args(_args(seq_length=128, seed=7), cfg)
    # Fewer iterations than train_steps, or an endless config, are fine.
    plm.check_args(_args(train_iters=5), cfg)
    plm.check_args(_args(train_iters=10 ** 6), corpus.config(train_steps=None))
    # Megatron's semantic flags that polyload always behaves as on.
    with pytest.warns(UserWarning, match="--eod-mask-loss, --reset-position-ids off"):
        plm.check_args(_args(eod_mask_loss=False, reset_position_ids=False), cfg)


def test_state_saved_with_checkpoint(corpus, tmp_path):
    cfg = corpus.config(topology={"dp": 1}, train_steps=6)
    with plm.MegatronIterator(_loader(cfg), device="cpu") as it:
        full = [m["tokens"].clone() for m in it]
    with plm.MegatronIterator(_loader(cfg), device="cpu") as it:
        for _ in range(5):
            next(it)
        path = plm.save_checkpoint_state(it, str(tmp_path), iteration=5)
        assert path == str(tmp_path / "iter_0000005" / plm.STATE_FILE)
        assert it.save_state() == it.state_dict()  # the hook Megatron calls
        for _ in range(2):
            next(it)
        plm.save_checkpoint_state(it, str(tmp_path), iteration=7)
    # Megatron's tracker names the latest iteration; without it, the largest iter_*.
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("5\n")
    with plm.MegatronIterator(_loader(cfg), device="cpu") as it:
        assert plm.load_checkpoint_state(it, str(tmp_path)) == 5
        rest = [m["tokens"] for m in it]
    assert len(rest) == len(full) - 5
    for a, b in zip(rest, full[5:]):
        assert torch.equal(a, b)
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    with plm.MegatronIterator(_loader(cfg), device="cpu") as it:
        assert plm.load_checkpoint_state(it, str(tmp_path)) == 7
        assert torch.equal(next(it)["tokens"], full[7])
        it.restore_state(it.state_dict())
    with pytest.raises(FileNotFoundError):
        plm.load_checkpoint_state(plm.MegatronIterator(_loader(cfg)), str(tmp_path / "none"))
    # A state from another config is refused with the field named.
    other = corpus.config(topology={"dp": 1}, seed=99)
    with pytest.raises(polyload.StateError, match="seed"):
        plm.load_checkpoint_state(plm.MegatronIterator(_loader(other)), str(tmp_path), 7)


@pytest.mark.parametrize("mode", ["fixed", "native"])
def test_image_fields(tmp_path, mode):
    """MegatronIterator hands the image fields on with the tokens: equal to the Loader's,
    and image_positions index placeholder runs of the flattened tokens."""
    from conftest import write_vlm_corpus

    write_vlm_corpus(tmp_path / "vlm")
    cfg = {"seed": 2, "seq_length": 1024, "global_batch_size": 4, "micro_batch_size": 2,
           "train_steps": 2, "topology": {"dp": 1},
           "sources": [{"name": "img", "type": "webdataset", "index": "memory", "weight": 1.0,
                        "path": str(tmp_path / "vlm" / "shard-{000000..000003}.tar"),
                        "image": {"mode": mode, "token_id": 300, "max_pixels": 28 * 28 * 64}}]}
    with polyload.Loader(cfg, rank=0) as loader:
        want = [{k: v.clone() for k, v in b.items() if torch.is_tensor(v)} for b in loader]
    with plm.MegatronIterator(cfg, device="cpu") as it:
        got = list(it)
    assert len(got) == len(want) == 4
    for m, w in zip(got, want):
        assert {"pixel_values", "image_grid_thw", "image_positions"} <= set(m)
        for k in ("pixel_values", "image_grid_thw", "image_positions"):
            assert m[k].dtype == w[k].dtype and torch.equal(m[k], w[k]), k
        assert m["pixel_values"].dim() == (4 if mode == "fixed" else 2)
        tok = m["tokens"][0]
        for at, n in m["image_positions"].tolist():
            assert bool((tok[at:at + n] == 300).all())
            assert bool((m["loss_mask"][0, at:at + n - 1] == 0).all())
