"""polyload.Loader: batches equal the plan, exact resume, elastic dp, dict configs, stats,
pipeline fields, and polyload.torch.broadcast_tp over gloo."""

import collections
import os

import numpy as np
import pytest
import yaml

import polyload
from polyload import _core

from conftest import SOURCE_BASE, batch_hash  # noqa: E402

torch = pytest.importorskip("torch")


def expected_micro_batch(corpus, plan, r, mb, pad_id=0):
    """The micro-batch of DP rank r, micro-batch mb, from the plan and the position
    formula of the corpus (SPEC section 3)."""
    S, rows, nmb = plan["seq_length"], plan["micro_batch_size"], plan["micro_batches_per_rank"]
    chunks = np.asarray(plan["chunks"])
    offs = np.asarray(plan["seq_offsets"])
    rank_seq = np.asarray(plan["rank_sequences"])
    ids = np.full((rows, S), pad_id, dtype=np.int64)
    labels = np.full((rows, S), -100, dtype=np.int64)
    mask = np.zeros((rows, S), dtype=np.float32)
    pos = np.zeros((rows, S), dtype=np.int64)
    cu, max_seg = [0], 0
    for row in range(rows):
        q = rank_seq[(r * nmb + mb) * rows + row]
        p = 0
        for source, index, offset, length, flags in chunks[offs[q]:offs[q + 1]]:
            toks = corpus.tokens(source, index, offset, length)
            ids[row, p:p + length] = toks
            lab = toks + 1
            doc_end = offset + length == corpus.lengths[source][index]
            assert bool(flags & _core.CHUNK_DOC_END) == doc_end
            if doc_end:
                lab[-1] = -100
            labels[row, p:p + length] = lab
            mask[row, p:p + length] = (lab != -100).astype(np.float32)
            pos[row, p:p + length] = np.arange(length)
            p += length
            cu.append(row * S + p)
            max_seg = max(max_seg, length)
        if p < S:  # the row's padding is a segment of its own (positions restart too)
            pos[row, p:] = np.arange(S - p)
            cu.append((row + 1) * S)
            max_seg = max(max_seg, S - p)
    # Loss tokens: a chunk's tokens but its document's last, over the step and the rank.
    def loss_tokens(cs):
        return int(sum(c[3] - (c[4] & _core.CHUNK_DOC_END) for c in cs))

    per = nmb * rows
    rank_chunks = [c for q in rank_seq[r * per:(r + 1) * per] for c in chunks[offs[q]:offs[q + 1]]]
    return {"input_ids": ids, "labels": labels, "loss_mask": mask, "position_ids": pos,
            "cu_seqlens": np.asarray(cu, dtype=np.int32), "max_seqlen": max_seg,
            "step_loss_tokens": loss_tokens(chunks), "rank_loss_tokens": loss_tokens(rank_chunks),
            "non_padding_tokens": int(sum(
                c[3] for q in rank_seq[(r * nmb + mb) * rows:(r * nmb + mb + 1) * rows]
                for c in chunks[offs[q]:offs[q + 1]]))}


@pytest.mark.parametrize("extra", [{}, {"long_documents": "truncate"},
                                   {"packing": "concat_chunk"}],
                         ids=["best_fit", "truncate", "concat_chunk"])
def test_iteration_equals_plan(corpus, extra):
    """Batches equal the plan's chunks read from the position corpus; with truncate, a
    truncated chunk's last token keeps its label (the document's next token)."""
    d = corpus.config(train_steps=10, **extra)
    truncated = 0
    planner = _core.Planner.create(_core.Config.parse_string(yaml.safe_dump(d)))
    with polyload.Loader(d, rank=0, ranks=[0, 1]) as loader:
        for step in range(10):
            plan = planner.next()
            assert plan["step"] == step and plan["dp"] == 2
            for source, index, offset, length, flags in np.asarray(plan["chunks"]):
                truncated += offset + length < corpus.lengths[source][index] and (
                    not flags & _core.CHUNK_DOC_END)
            for mb in range(plan["micro_batches_per_rank"]):
                for r in (0, 1):
                    got = loader.next_batch(r)
                    want = expected_micro_batch(corpus, plan, r, mb)
                    assert set(got) == set(want)
                    for k, v in want.items():
                        g = got[k] if isinstance(got[k], int) else got[k].numpy()
                        np.testing.assert_array_equal(g, v, err_msg=f"step {step} r {r} mb {mb} {k}")
        assert loader.next_batch(0) is None and loader.next_batch(1) is None
        with pytest.raises(StopIteration):
            next(loader)
    assert truncated > 0  # chunks whose last label is the document's next token


def run_hashes(loader, n=None):
    out = []
    for b in loader:
        out.append(batch_hash(b))
        if n is not None and len(out) == n:
            break
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_exact_resume(corpus, rank):
    d = corpus.config(train_steps=14)
    with polyload.Loader(d, rank=rank) as loader:
        ref = run_hashes(loader)
    assert len(ref) == 14 * 2
    for cut in (0, 1, 5, 10, 17, 28):  # step boundaries and mid-step cuts
        with polyload.Loader(d, rank=rank, threads=1, prefetch=1) as a:
            head = run_hashes(a, cut) if cut else []
            state = a.state_dict()
        with polyload.Loader(d, rank=rank, threads=3, prefetch=5) as b:
            b.load_state_dict(state)
            tail = run_hashes(b)
        assert head + tail == ref, f"cut {cut}"


def _delivered(loader, dp, n):
    """n micro-batches of every DP rank: their non-padding tokens (each token value is
    its position in the corpus: conftest.Corpus) and per-batch hashes."""
    toks, hashes = [], []
    for _ in range(n):
        for r in range(dp):
            b = loader.next_batch(r)
            ids = b["input_ids"].numpy()
            toks.append(ids[ids != 0])
            hashes.append(batch_hash(b))
    return (np.concatenate(toks) if toks else np.zeros(0, np.int64)), hashes


def test_weights_change_mid_step_finishes_the_step(corpus):
    """A state taken in the middle of step 5 and loaded with other weights: step 5 ends
    as it was planned, the new weights apply from step 6.  Every batch (and so the
    delivered documents, before + after) equals a run that changes the weights at the
    step-6 boundary: nothing lost, nothing repeated; after step 5 the drawn tokens follow
    the new weights within one chunk (SPEC section 1)."""
    steps, s, cut = 14, 5, 2
    a = corpus.config(train_steps=steps, global_batch_size=16)  # 4 micro-batches a rank
    new_w = (0.1, 0.2, 0.7)
    b = dict(a, sources=[dict(x, weight=w) for x, w in zip(a["sources"], new_w)])
    nmb, dp = 4, 2
    with polyload.Loader(a, rank=0, ranks=[0, 1]) as la:  # a throughout
        only_a, only_a_h = _delivered(la, dp, steps * nmb)
    with polyload.Loader(a, rank=0, ranks=[0, 1]) as la:  # reference: b from step 6
        ref1, ref1_h = _delivered(la, dp, (s + 1) * nmb)
        edge = la.state_dict()
    with polyload.Loader(b, rank=0, ranks=[0, 1]) as lb:
        lb.load_state_dict(edge)
        ref2, ref2_h = _delivered(lb, dp, (steps - s - 1) * nmb)
        assert lb.next_batch(0) is None
        ref_end = lb.state_dict()
    with polyload.Loader(a, rank=0, ranks=[0, 1]) as la:  # mid-step cut
        head, head_h = _delivered(la, dp, s * nmb + cut)
        mid = la.state_dict()
    info = _core.state_info(mid["blob"])
    assert (info["step"], info["micro_batch"], info["version"]) == (s, cut, 3)
    with polyload.Loader(b, rank=0, ranks=[0, 1], threads=1, prefetch=1) as lb:
        lb.load_state_dict(mid)
        tail, tail_h = _delivered(lb, dp, (steps - s) * nmb - cut)
        assert lb.next_batch(0) is None
        end = lb.state_dict()
    assert head_h + tail_h == ref1_h + ref2_h
    assert end["blob"] == ref_end["blob"]
    got = collections.Counter(np.concatenate([head, tail]).tolist())
    want = collections.Counter(np.concatenate([ref1, ref2]).tolist())
    assert got == want
    # the check can fail: the new weights do change what comes after step 5
    assert only_a_h[:(s + 1) * nmb * dp] == ref1_h
    assert only_a_h[(s + 1) * nmb * dp:] != ref2_h
    # drawn tokens from the step-6 boundary to the end follow the new weights
    s0 = _core.state_info(edge["blob"])["sources"]
    s1 = _core.state_info(end["blob"])["sources"]
    drawn = [y["drawn_tokens"] - x["drawn_tokens"] for x, y in zip(s0, s1)]
    total = sum(drawn)
    assert total > 0
    for d, w in zip(drawn, new_w):
        assert abs(d - w * total) <= corpus.seq_length, (drawn, new_w)
    # the per-document view: same documents, each as often (token positions -> docs)
    def docs(toks):
        src = toks // SOURCE_BASE - 1
        pos = toks % SOURCE_BASE
        return collections.Counter(
            (int(k), int(np.searchsorted(corpus.starts[k], p, side="right") - 1))
            for k, p in zip(src, pos))
    assert docs(np.concatenate([head, tail])) == docs(np.concatenate([ref1, ref2]))
    with polyload.Loader(a, rank=0) as same:  # the same weights: as before, exact
        same.load_state_dict(mid)


def step_multisets(loader, dp, nmb, steps):
    """Per step: the sorted non-padding tokens of every rank's micro-batches."""
    out = []
    for _ in range(steps):
        toks = []
        for _mb in range(nmb):
            for r in range(dp):
                ids = loader.next_batch(r)["input_ids"].numpy()
                toks.append(ids[ids != 0])
        out.append(np.sort(np.concatenate(toks)))
    return out


def test_elastic_dp4_to_dp2_keeps_step_membership(corpus):
    steps, cut = 12, 5
    d4 = corpus.config(train_steps=steps, topology={"dp": 4}, global_batch_size=8,
                       micro_batch_size=2)
    d2 = corpus.config(train_steps=steps, topology={"dp": 2}, global_batch_size=8,
                       micro_batch_size=2)
    with polyload.Loader(d4, rank=0, ranks=range(4)) as ref_loader:
        ref = step_multisets(ref_loader, 4, 1, steps)
    with polyload.Loader(d4, rank=0, ranks=range(4)) as a:
        head = step_multisets(a, 4, 1, cut)
        state = a.state_dict()
    with polyload.Loader(d2, rank=0, ranks=range(2)) as b:
        b.load_state_dict(state)
        tail = step_multisets(b, 2, 2, steps - cut)
        assert b.next_batch(0) is None
    for s, (x, y) in enumerate(zip(head + tail, ref)):
        np.testing.assert_array_equal(x, y, err_msg=f"step {s}")


def test_dict_and_yaml_config_agree(corpus, tmp_path):
    d = corpus.config(train_steps=4)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(d))
    with polyload.Loader(d, rank=1) as a, polyload.Loader(str(path), rank=1) as b:
        assert run_hashes(a) == run_hashes(b)
    cfg = _core.Config.parse_file(str(path))
    with polyload.Loader(cfg, rank=1) as c:
        assert len(run_hashes(c)) == 8
    with pytest.raises(TypeError):
        polyload.Loader(42)


def test_default_rank_from_environment(corpus, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with polyload.Loader(corpus.config(train_steps=1)) as loader:
        assert loader.rank == 1
        assert all(True for _ in loader)
    monkeypatch.delenv("RANK")
    with polyload.Loader(corpus.config(train_steps=1)) as loader:
        assert loader.rank == 0


def test_stats_fields(corpus):
    steps = 6
    with polyload.Loader(corpus.config(train_steps=steps), rank=0) as loader:
        batches = list(loader)
        st = loader.stats()
    assert set(st) == {"steps", "tokens", "padding_fraction", "tokens_per_s", "seconds",
                       "skipped", "data_wait_s", "images_replaced", "imbalance", "sources"}
    assert isinstance(st["data_wait_s"], float) and st["data_wait_s"] >= 0
    assert st["images_replaced"] == 0
    assert st["steps"] == steps and st["skipped"] == 0
    non_pad = sum(int((b["input_ids"].numpy() != 0).sum()) for b in batches)
    assert st["tokens"] == non_pad
    assert 0 <= st["padding_fraction"] < 1 and st["seconds"] > 0 and st["tokens_per_s"] > 0
    assert set(st["imbalance"]) == {"max_over_mean", "max_over_lower_bound"}
    assert set(st["sources"]) == {"s0", "s1", "s2"}
    for s in st["sources"].values():
        assert set(s) == {"documents", "tokens", "epochs_completed", "realized_fraction",
                          "scheduled_fraction"}
    assert abs(sum(s["realized_fraction"] for s in st["sources"].values()) - 1) < 1e-9
    assert abs(st["sources"]["s0"]["scheduled_fraction"] - 0.5) < 1e-9


def test_data_wait(corpus):
    """The in-process loader reports its data wait; a rank's first request (the
    pipeline filling) is left out, so one batch in it is exactly 0."""
    with polyload.Loader(corpus.config(train_steps=3), rank=0) as loader:
        next(iter(loader))
        assert loader.stats()["data_wait_s"] == 0.0
        for _ in loader:
            pass
        w = loader.stats()["data_wait_s"]
    assert isinstance(w, float) and 0 <= w < 3600


def test_pipeline_stage_fields(corpus):
    d = corpus.config(train_steps=1, topology={"dp": 1, "pp": 3, "tp": 1},
                      global_batch_size=2)
    cfg = _core.Config.parse_string(yaml.safe_dump(d))
    by_stage = {}
    for rank in range(3):
        stage = cfg.rank_info(rank)["pp_rank"]
        with polyload.Loader(d, rank=rank) as loader:
            by_stage[stage] = next(loader)
    first, middle, last = by_stage[0], by_stage[1], by_stage[2]
    assert set(first) == {"input_ids", "position_ids", "cu_seqlens", "max_seqlen",
                          "non_padding_tokens"}
    assert set(middle) == {"cu_seqlens", "max_seqlen"}
    assert set(last) == {"labels", "loss_mask", "cu_seqlens", "max_seqlen", "step_loss_tokens",
                         "rank_loss_tokens"}  # with the loss mask: the stage with the loss
    assert last["step_loss_tokens"] == last["rank_loss_tokens"] == int(last["loss_mask"].sum())
    assert torch.equal(first["cu_seqlens"], last["cu_seqlens"])


def test_int32_dtype(corpus):
    with polyload.Loader(corpus.config(train_steps=1, dtype="int32"), rank=0) as loader:
        b = next(loader)
    assert b["input_ids"].dtype == torch.int32 and b["labels"].dtype == torch.int32
    assert b["position_ids"].dtype == torch.int64


# ------------------------------------------------------------------ broadcast_tp


def _tp_worker(rank, world, init_file, cfg, result_dir):
    import torch.distributed as dist

    from polyload.torch import broadcast_tp

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        group = dist.new_group([0, 1])
        # for checking only: TP peers match (with the source fields, broadcast too)
        mine = polyload.Loader(cfg, rank=rank, with_sources=True)
        reader = polyload.Loader(cfg, rank=0, with_sources=True) if rank == 0 else None
        n = 0
        while True:
            want = next(mine, None)
            got = broadcast_tp(next(reader, None) if reader else None, group) \
                if want is not None else None
            if want is None:
                break
            assert set(got) == set(want), (set(got), set(want))
            assert "segment_sources" in got and "step" in got
            for k, v in want.items():
                if isinstance(v, int):
                    assert got[k] == v
                else:
                    assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
            n += 1
        with open(os.path.join(result_dir, f"ok{rank}"), "w") as f:
            f.write(str(n))
    finally:
        dist.destroy_process_group()


def test_broadcast_tp_gloo(corpus, tmp_path):
    import torch.multiprocessing as mp

    cfg = corpus.config(train_steps=3, topology={"dp": 1, "tp": 2}, global_batch_size=4)
    mp.spawn(_tp_worker, args=(2, str(tmp_path / "init"), cfg, str(tmp_path)), nprocs=2,
             join=True)
    counts = [int((tmp_path / f"ok{r}").read_text()) for r in (0, 1)]
    assert counts == [3 * 2, 3 * 2]


@pytest.mark.parametrize("mode", ["fixed", "native"])
def test_broadcast_tp_gloo_images(tmp_path, mode):
    """Micro-batches with images: pixel_values (4-D in fixed mode, 2-D patches in native
    mode), image_grid_thw and image_positions reach the TP peer equal to its own Loader's,
    and micro-batches without images carry none."""
    import torch.multiprocessing as mp

    from conftest import write_vlm_corpus

    write_vlm_corpus(tmp_path / "vlm")
    cfg = {"seed": 2, "seq_length": 1024, "global_batch_size": 4, "micro_batch_size": 2,
           "train_steps": 2, "topology": {"dp": 1, "tp": 2},
           "sources": [{"name": "img", "type": "webdataset", "index": "memory", "weight": 1.0,
                        "path": str(tmp_path / "vlm" / "shard-{000000..000003}.tar"),
                        "image": {"mode": mode, "token_id": 300, "max_pixels": 28 * 28 * 64}}]}
    with polyload.Loader(cfg, rank=0) as loader:
        assert all("pixel_values" in b for b in loader)
    mp.spawn(_tp_worker, args=(2, str(tmp_path / "init"), cfg, str(tmp_path)), nprocs=2,
             join=True)
    counts = [int((tmp_path / f"ok{r}").read_text()) for r in (0, 1)]
    assert counts == [2 * 2, 2 * 2]


def test_roles_one_by_one_equal_the_loader(corpus):
    """Planner -> encoded plan -> reads -> Source.read_many -> Constructor.build gives the
    Loader's batches bit for bit (the path of a multi-process deployment)."""
    d = corpus.config(train_steps=4)
    cfg = _core.Config.parse_string(yaml.safe_dump(d))
    planner = _core.Planner.create(cfg)
    sources = planner.sources
    ctor = _core.Constructor.create(cfg)
    with polyload.Loader(d, rank=0, ranks=[0, 1]) as loader:
        for step in range(4):
            plan = _core.Plan.decode(planner.next_plan().encode())
            assert plan.step == step
            for mb in range(plan.micro_batches_per_rank):
                for r in (0, 1):
                    reads = np.asarray(plan.reads(cfg.rank_info(r)["dp_rank"], mb))
                    payloads = [sources[int(x[0])].read_many(x[None, :]) for x in reads]
                    b = ctor.build(plan, r, mb, payloads)
                    want = loader.next_batch(r)
                    for k in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens"):
                        np.testing.assert_array_equal(np.asarray(getattr(b, k)), want[k].numpy())
                    assert b.max_seqlen == want["max_seqlen"]
        with pytest.raises(polyload.RangeError):
            plan.reads(2, 0)
    with pytest.raises(polyload.PolyloadError):
        _core.Plan.decode(b"PLPN garbage")
    # read_many is the concatenation of single reads
    reads = np.array([[0, 3, 1, 4], [0, 5, 0, 2]], dtype=np.int64)
    got = np.asarray(sources[0].read_many(reads))
    np.testing.assert_array_equal(got, np.concatenate([corpus.tokens(0, 3, 1, 4),
                                                       corpus.tokens(0, 5, 0, 2)]))


def test_bad_state_and_rank_arguments(corpus, monkeypatch):
    """load_state_dict and ranks check their types instead of converting silently."""
    with polyload.Loader(corpus.config(train_steps=3), rank=0) as loader:
        good = loader.state_dict()
        for bad, exc in ((None, TypeError), ([], TypeError), ("blob", TypeError),
                         ({"version": 1}, ValueError), ({"version": 2, "blob": b""}, ValueError),
                         ({"version": True, "blob": good["blob"]}, ValueError),
                         ({"version": 1, "blob": 5}, TypeError),
                         ({"version": 1, "blob": [1, 2, 3]}, TypeError)):
            with pytest.raises(exc):
                loader.load_state_dict(bad)
        loader.load_state_dict(dict(good, blob=bytearray(good["blob"])))
        for bad in (1.7, "1", True):
            with pytest.raises(TypeError):
                loader.next_batch(bad)
    with pytest.raises(TypeError):
        polyload.Loader(corpus.config(train_steps=1), rank=0.5)
    monkeypatch.setenv("RANK", "abc")
    with pytest.raises(ValueError, match="RANK"):
        polyload.Loader(corpus.config(train_steps=1))


def test_state_dict_and_stats_concurrent_with_next(corpus):
    """state_dict() and stats() from other threads while two threads take every
    micro-batch (one per DP rank): batches equal a run without observers, every
    state read meanwhile is valid and never moves backwards, resuming from one of
    them continues exactly, and the statistics only grow."""
    import threading

    cfg = corpus.config(train_steps=30)
    nmb = 2  # 8 / (dp 2 * micro 2)

    def consume(loader, rank, out, start=0, ready=None):
        if ready is not None:
            ready.wait(timeout=60)  # both observers have read once
        for k, b in enumerate(iter(lambda: loader.next_batch(rank), None), start):
            out[k] = batch_hash(b)

    with polyload.Loader(cfg, rank=0, ranks=[0, 1]) as loader:
        ref = [{}, {}]
        for r in (0, 1):
            consume(loader, r, ref[r])
    with polyload.Loader(cfg, rank=0, ranks=[0, 1]) as loader:
        got = [{}, {}]
        stop = threading.Event()
        states, stats, errors = [], [], []
        ready = threading.Barrier(4)

        def observe_state():
            try:
                states.append(loader.state_dict()["blob"])
                ready.wait(timeout=60)
                while not stop.is_set():
                    states.append(loader.state_dict()["blob"])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        def observe_stats():
            try:
                stats.append(loader.stats())
                ready.wait(timeout=60)
                while not stop.is_set():
                    stats.append(loader.stats())
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        obs = [threading.Thread(target=observe_state), threading.Thread(target=observe_stats)]
        cons = [threading.Thread(target=consume, args=(loader, r, got[r], 0, ready))
                for r in (0, 1)]
        for t in obs + cons:
            t.start()
        for t in cons:
            t.join()
        stop.set()
        for t in obs:
            t.join()
        assert not errors
        assert got == ref
        assert states and stats
        pos = [(_core.state_info(s)["step"], _core.state_info(s)["micro_batch"]) for s in states]
        assert pos == sorted(pos)
        mbs = [s["tokens"] for s in stats]
        assert mbs == sorted(mbs)
        assert stats[-1]["tokens"] <= loader.stats()["tokens"]
        mid = states[len(states) // 2]
    step, mb = pos[len(pos) // 2]
    with polyload.Loader(cfg, rank=0, ranks=[0, 1]) as loader:
        loader.load_state_dict({"version": polyload.STATE_VERSION, "blob": mid})
        res = [{}, {}]
        for r in (0, 1):
            consume(loader, r, res[r], start=step * nmb + mb)
        for r in (0, 1):
            assert res[r] == {k: v for k, v in ref[r].items() if k >= step * nmb + mb}
