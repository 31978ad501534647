"""Validation and test data: ``split`` (Megatron's ``--split``), ``valid_sources``
(``blend_per_split``), :meth:`polyload.Loader.eval_iter`, :func:`polyload.eval_loader` and
``polyload.megatron.MegatronEvalIterator``.

The document ranges are checked against megatron-core's own split functions; a pass
against the union of the split's documents (token value == position, so every token
names its document); independence from the training loader by its state blob and its
batches."""

import warnings

import numpy as np
import pytest

import polyload
from polyload import ConfigError, ConfigWarning
from conftest import SOURCE_BASE, batch_hash

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _no_world(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)


def _ranges(corpus, split):
    """Documents [lo, hi) per source and part, by megatron-core's functions."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_config import (
            convert_split_vector_to_split_matrix,
            parse_and_normalize_split,
        )
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    out = []
    for lengths in corpus.lengths:
        n = len(lengths)
        out.append([(0, 0) if m is None else (int(round(m[0] * n)), int(round(m[1] * n)))
                    for m in matrix])
    return out


def _doc_tokens(corpus, s, lo, hi):
    start = SOURCE_BASE * (s + 1)
    return np.arange(start + corpus.starts[s][lo], start + corpus.starts[s][hi])


def _tokens(batches):
    """Every non-padding token of the batches (pad_id 0 never occurs in the corpus)."""
    ids = np.concatenate([b["input_ids"].numpy().ravel() for b in batches])
    return np.sort(ids[ids != 0])


def _loader(cfg, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return polyload.Loader(cfg, **kw)


def _drain(loader, ranks=(0, 1)):
    out = []
    while True:
        got = [loader.next_batch(r) for r in ranks]
        if all(b is None for b in got):
            return out
        assert all(b is not None for b in got)  # every rank ends at the same step
        out.extend(got)


def test_split_pass_reads_the_valid_documents_once(corpus):
    cfg = corpus.config(split="80,10,10", train_steps=40)
    ranges = _ranges(corpus, "80,10,10")
    want = np.sort(np.concatenate([_doc_tokens(corpus, s, *ranges[s][1]) for s in range(3)]))
    with _loader(cfg, rank=0, ranks=[0, 1]) as train:
        before = train.state_dict()
        with train.eval_iter() as ev:
            first = _drain(ev)
            st = ev.stats()
        np.testing.assert_array_equal(_tokens(first), want)  # each valid token once
        assert st["tokens"] == len(want) and st["steps"] == len(first) // 2 // 2
        assert train.state_dict() == before  # the pass touched no training state
        # train for a while, then the same pass again
        train_batches = [train.next_batch(r) for _ in range(30) for r in (0, 1)]
        with train.eval_iter() as ev:
            again = _drain(ev)
        assert [batch_hash(b) for b in again] == [batch_hash(b) for b in first]
        # the training loader's stats count its own batches only
        assert train.stats()["tokens"] == sum(int((b["input_ids"] != 0).sum())
                                              for b in train_batches)
    # training reads only train ranges
    seen = _tokens(train_batches)
    for s in range(3):
        for part in (1, 2):
            lo, hi = ranges[s][part]
            if hi > lo:
                doc = _doc_tokens(corpus, s, lo, hi)
                assert not np.isin(seen, doc).any(), f"source {s} part {part}"


def test_eval_loader_ranks_and_steps(corpus):
    cfg = corpus.config(split="80,10,10")
    with polyload.eval_loader(cfg, "valid", rank=0, ranks=[0, 1]) as ev:
        both = _drain(ev)
    one = []
    for r in (0, 1):  # one process per rank: the same batches
        with polyload.eval_loader(cfg, "valid", rank=r, threads=1) as ev:
            one.append([batch_hash(b) for b in ev])
    assert one[0] == [batch_hash(b) for b in both[0::2]]
    assert one[1] == [batch_hash(b) for b in both[1::2]]
    with polyload.eval_loader(cfg, "valid", steps=1, rank=0) as ev:
        assert len(list(ev)) == 8 // (2 * 2)
    with polyload.eval_loader(cfg, "test", rank=0) as ev:
        ranges = _ranges(corpus, "80,10,10")
        test_tokens = sum(int(corpus.starts[s][ranges[s][2][1]] - corpus.starts[s][ranges[s][2][0]])
                          for s in range(3))
        list(ev)
    with polyload.eval_loader(cfg, "test", rank=0, ranks=[0, 1]) as ev:
        assert _tokens(_drain(ev)).size == test_tokens


def test_valid_sources_are_read_whole(corpus):
    cfg = corpus.config(valid_sources=[
        {"name": "v", "type": "megatron", "path": corpus.prefixes[1], "weight": 1.0}])
    with _loader(cfg, rank=0, ranks=[0, 1]) as train:
        with train.eval_iter("valid") as ev:
            got = _tokens(_drain(ev))
    np.testing.assert_array_equal(got, _doc_tokens(corpus, 1, 0, len(corpus.lengths[1])))


def test_errors(corpus):
    with _loader(corpus.config(), rank=0) as train:
        with pytest.raises(ConfigError, match="no validation data"):
            train.eval_iter()
        with pytest.raises(ValueError, match="'train'"):
            train.eval_iter("train")
    with pytest.raises(ConfigError, match="split"):
        _loader(corpus.config(split="1,2,3,4"), rank=0)
    with pytest.raises(ConfigError, match="steps"):
        polyload.eval_loader(corpus.config(split="8,1,1"), steps=0, rank=0)


def test_megatron_eval_iterator_repeats_the_same_evaluation(corpus):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("megatron.core")
    from polyload import megatron as plm

    cfg = corpus.config(split="80,10,10", topology={"dp": 1})
    nmb = 8 // 2
    it = plm.MegatronEvalIterator(cfg, "valid", eval_iters=2, device="cpu")
    evals = [[next(it) for _ in range(2 * nmb)] for _ in range(3)]  # three evaluations
    for e in evals[1:]:
        for a, b in zip(evals[0], e):
            assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["labels"], b["labels"])
    assert not torch.equal(evals[0][0]["tokens"], evals[0][nmb]["tokens"])  # 2 steps differ
    assert {"tokens", "labels", "loss_mask", "position_ids", "packed_seq_params"} <= set(
        evals[0][0])
    it.close()


def test_cli_run_split(corpus, tmp_path):
    import json
    import subprocess
    import sys

    import yaml

    cfg = corpus.config(split="80,10,10")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "polyload", "run", str(path), "--split", "valid",
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    with polyload.eval_loader(cfg, "valid", rank=0, ranks=[0, 1]) as ev:
        _drain(ev)
        st = ev.stats()
    assert got["tokens"] == st["tokens"] and got["steps"] == st["steps"]
    r = subprocess.run([sys.executable, "-m", "polyload", "run", str(path), "--split", "train"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--split" in r.stderr
