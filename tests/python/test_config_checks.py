"""Silent mistakes become errors or warnings: the topology against the
trainer's world size, ``topology.dp: auto``, orders without size-1 axes, config warnings,
``pad_id`` outside a known vocabulary, text files given as flat token files."""

import os
import warnings

import numpy as np
import pytest

import polyload
from polyload import ConfigError, ConfigWarning, FormatError, RangeError


@pytest.fixture
def no_world(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)


def _loader(cfg, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return polyload.Loader(cfg, **kw)


def test_warnings_are_issued(corpus, no_world):
    cfg = corpus.config()
    for s, w in zip(cfg["sources"], (3, 1, 1)):
        s["weight"] = w
    with pytest.warns(ConfigWarning) as rec:
        with polyload.Loader(cfg) as loader:
            b = next(loader)
    msgs = [str(r.message) for r in rec]
    import yaml

    line = yaml.safe_dump(cfg, sort_keys=False).splitlines().index("sources:") + 1
    assert msgs == [f"<dict>:{line}: weights of sources sum to 5, not 1: they are "
                    "normalized to s0 0.6, s1 0.2, s2 0.2"]
    assert b["input_ids"].shape == (2, corpus.seq_length)
    # The warning is the C library's, readable from the Config too.
    core_cfg = polyload._make_config(cfg)
    assert core_cfg.warnings == msgs
    assert core_cfg.source_weight(0) == pytest.approx(0.6)


def test_schedule_point_that_omits_a_source_warns(corpus, no_world):
    cfg = corpus.config(schedule={"points": [
        {"step": 0, "weights": {"s0": 0.5, "s1": 0.5}},
        {"step": 4, "weights": {"s0": 0.2, "s1": 0.3, "s2": 0.5}},
    ]})
    with pytest.warns(ConfigWarning) as rec:
        _ = polyload.Loader(cfg).close()
    msgs = [str(r.message) for r in rec]
    assert any("schedule.points[0] (step 0) omits source 's2': its weight is 0 there" in m
               for m in msgs), msgs
    assert any("sources[0].weight ('s0') is ignored: the schedule sets every weight" in m
               for m in msgs), msgs
    # A schedule point really gives s2 nothing before step 4: no s2 token in steps 0..1.
    with _loader(cfg, rank=0, ranks=[0, 1]) as loader:
        for _ in range(2 * 2):  # 2 steps x 2 micro-batches of rank 0
            ids = loader.next_batch(0)["input_ids"].numpy()
            assert not np.any(ids // polyload_base() == 3)
            loader.next_batch(1)


def polyload_base():
    from conftest import SOURCE_BASE

    return SOURCE_BASE


def test_missing_seq_length_warns(corpus, no_world):
    cfg = corpus.config()
    del cfg["seq_length"]
    core_cfg = polyload._make_config(cfg)
    assert core_cfg.warnings == ["<dict>: seq_length is not set: using the default 8192"]
    assert core_cfg.get_int("seq_length") == 8192


def test_world_size_mismatch_from_env(corpus, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError) as e:
        _loader(corpus.config())  # dp 2
    msg = e.value.message
    assert "topology dp=2 pp=1 cp=1 tp=1 has world size 2, but the trainer's world size " \
           "is 4" in msg
    assert "(trainer world size from WORLD_SIZE)" in msg
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        _loader(corpus.config())


def test_dp_auto_from_env(corpus, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    cfg = corpus.config(topology={"dp": "auto", "tp": 2, "order": "tp-dp"})
    ref = corpus.config(topology={"dp": 2, "tp": 2})
    monkeypatch.setenv("RANK", "3")
    with _loader(cfg) as a:
        assert a.world_size == 4
        assert a.rank_info["dp_rank"] == 1 and a.rank_info["tp_rank"] == 1
        got = [a.next_batch()["input_ids"].numpy().copy() for _ in range(4)]
    # The same batches as the explicit dp=2, tp=2 topology (order tp-cp-ep-dp-pp).
    with _loader(ref) as b:
        want = [b.next_batch()["input_ids"].numpy().copy() for _ in range(4)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # dp: auto that does not divide global_batch_size is an error naming both.
    monkeypatch.setenv("WORLD_SIZE", "6")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"topology.dp: auto = 3 \(world size 6\).*"
                                          r"global_batch_size 8 is not divisible"):
        _loader(cfg)


def test_world_size_from_torch_distributed(corpus, no_world, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0,
                            world_size=1)
    try:
        assert polyload.trainer_world_size() == (1, "torch.distributed.get_world_size()")
        with pytest.raises(ConfigError, match="has world size 2, but the trainer's world "
                                              r"size is 1 \(.*torch.distributed"):
            _loader(corpus.config())
        with _loader(corpus.config(topology={"dp": "auto"})) as loader:
            assert loader.world_size == 1
            assert loader.config.get_int("topology.dp") == 1
    finally:
        dist.destroy_process_group()


def test_rank_out_of_range_names_topology_and_world_size(corpus, no_world, monkeypatch):
    with pytest.raises(RangeError) as e:
        _loader(corpus.config(), rank=5)
    assert "rank 5 out of range [0, 2): the topology is dp=2 pp=1 cp=1 tp=1; " \
           "WORLD_SIZE is not set" in e.value.message
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RangeError, match="the trainer's world size is 2"):
        _loader(corpus.config(), rank=2)


def test_order_may_leave_out_size_one_axes(corpus, no_world):
    with _loader(corpus.config(topology={"dp": 2, "order": "dp"}), rank=1) as loader:
        assert loader.rank_info["dp_rank"] == 1
    with pytest.raises(ConfigError, match="axis 'dp' missing, but topology.dp is 2"):
        _loader(corpus.config(topology={"dp": 2, "order": "tp-cp-pp"}))


def test_pad_id_outside_vocabulary(corpus, no_world):
    with pytest.raises(ConfigError, match=r"pad_id 32000 is outside the vocabulary "
                                          r"\(vocab_size 32000\)"):
        _loader(corpus.config(pad_id=32000, vocab_size=32000))
    _loader(corpus.config(pad_id=31999, vocab_size=32000)).close()


def test_text_file_as_flat_source(tmp_path, no_world):
    p = tmp_path / "mix.yaml"
    p.write_text("seq_length: 64\nglobal_batch_size: 4\nsources:\n"
                 "  - {name: t, type: flat, path: mix.yaml}\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(FormatError, match=r"mix.yaml: the file holds text \(or YAML\), "
                                              r"not uint16 tokens"):
            _loader(str(p))
    finally:
        os.chdir(cwd)
    # A real token file opens: 20 eos (at 0, 10, ..., 190) end 20 documents, and the
    # tokens after the last eos form a 21st.
    toks = np.arange(1, 200, dtype=np.uint16)
    toks[::10] = 0
    toks.tofile(tmp_path / "tok.bin")
    src = polyload._core.Source.open("flat", str(tmp_path / "tok.bin"), write_index=-1)
    assert src.num_documents == 21
    side = tmp_path / "tok.bin.plidx"
    assert not side.exists()
    assert polyload._core.Source.open("flat", str(tmp_path / "tok.bin"),
                                      write_index=2).num_documents == 21  # read only
    assert not side.exists()


def test_sidecar_index_key(tmp_path, no_world):
    """sidecar_index: memory keeps the .plidx in memory; the default writes it once."""
    toks = np.arange(1, 2000, dtype=np.uint16)
    toks[::10] = 0
    toks.tofile(tmp_path / "tok.bin")
    side = tmp_path / "tok.bin.plidx"
    cfg = {"seq_length": 16, "global_batch_size": 2, "micro_batch_size": 1, "train_steps": 2,
           "sources": [{"name": "t", "type": "flat", "path": str(tmp_path / "tok.bin")}]}
    with polyload.Loader(dict(cfg, sidecar_index="memory"), rank=0) as loader:
        a = [b["input_ids"].tolist() for b in loader]
    assert not side.exists()
    with polyload.Loader(cfg, rank=0) as loader:
        b = [x["input_ids"].tolist() for x in loader]
    assert side.exists() and a == b
    with pytest.raises(polyload.ConfigError, match="sidecar_index"):
        _loader(dict(cfg, sidecar_index="sometimes"))


def test_max_epochs_caps_a_source(corpus, no_world):
    """A source with max_epochs: 1 is read once, then its weight goes to the others; when
    every source is spent, the planner stops with an error that says so."""
    small = int(np.sum(corpus.lengths[1]))  # s1: 61 short documents
    base = corpus.config(topology={"dp": 1}, train_steps=30)
    capped = corpus.config(topology={"dp": 1}, train_steps=30)
    capped["sources"][1]["max_epochs"] = 1

    def run(cfg):
        with _loader(cfg) as loader:
            n = sum(1 for _ in loader)
            return n, loader.stats()

    n0, st0 = run(base)
    n1, st1 = run(capped)
    assert n0 == n1 == 30 * 4
    assert st0["sources"]["s1"]["epochs_completed"] >= 2  # without the cap: read again
    s1 = st1["sources"]["s1"]
    assert s1["epochs_completed"] == 1
    assert s1["documents"] == len(corpus.lengths[1])
    assert s1["tokens"] == small
    assert st1["sources"]["s0"]["tokens"] > st0["sources"]["s0"]["tokens"]
    # Every source capped: the run stops with an error naming max_epochs.
    only = corpus.config(topology={"dp": 1}, train_steps=None,
                         sources=[dict(capped["sources"][1], weight=1.0)])
    with _loader(only) as loader:
        with pytest.raises(ConfigError, match="has been read max_epochs times"):
            for _ in range(1000):
                next(loader)
    with pytest.raises(ConfigError, match="max_epochs must be a positive integer"):
        _loader(corpus.config(sources=[dict(capped["sources"][1], max_epochs=0)]))
