"""A deployment's batches equal the embedded loader's (polyload.ray on a local 3-node Ray
cluster, SPEC section 7): trainer clients in separate processes (gloo), any numbers of
actors, every topology, placement by node resources, exact state round trip and restart,
and actor errors as polyload's exception types at the step where the embedded loader
raises them."""

import json
import os

import numpy as np
import pytest

import polyload
from polyload import _core

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pr = pytest.importorskip("polyload.ray")

from conftest import Corpus, batch_hash, shm_leftover, write_megatron  # noqa: E402
from ray_helpers import (  # noqa: E402
    NS, loader_hashes, client_hashes, wait_gone, PLACEMENT, _loader_run, _hashes_until_error)


def _trainer(rank, world, init_file, address, cfg, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        ray.init(address=address, namespace=NS, log_to_driver=False)
        with pr.Client(cfg, namespace=NS, name="multi") as client:  # rank from torch.distributed
            assert client.rank == rank
            hashes = client_hashes(client)
            stats = client.stats()
        dist.barrier()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"hashes": hashes, "steps": stats["steps"], "pid": os.getpid()}, f)
    finally:
        ray.shutdown()
        dist.destroy_process_group()


def test_trainer_processes_get_the_embedded_batches(cluster, tmp_path_factory):
    """dp 2 x tp 2: four gloo trainer processes, two constructors on the constructor node,
    partitioned sources on the loader node; every rank's batches equal the Loader's."""
    import torch.multiprocessing as mp

    corpus = Corpus(tmp_path_factory.mktemp("multi"))
    cfg = corpus.config(train_steps=5, topology={"dp": 2, "tp": 2})
    world = 4
    shm_before = set(os.listdir("/dev/shm"))
    dep = pr.launch(cfg, num_source_loaders={"s0": 2, "s2": 3}, num_constructors=2,
                    namespace=NS, name="multi", placement=PLACEMENT)
    try:
        ids = cluster.node_ids
        assert dep.info["nodes"]["planner"] == [ids["head_node"]]
        assert dep.info["nodes"]["source_loader"] == [ids["loader_node"]] * 6
        assert dep.info["nodes"]["constructor"] == [ids["ctor_node"]] * 2
        assert dep.info["dp_groups"] == [[0], [1]]
        pids = [p for ps in dep.pids().values() for p in ps]
        out = tmp_path_factory.mktemp("trainers")
        mp.spawn(_trainer, args=(world, str(out / "init"), cluster.address, cfg, str(out)),
                 nprocs=world, join=True)
        for rank in range(world):
            got = json.loads((out / f"rank{rank}.json").read_text())
            want, _ = loader_hashes(cfg, rank)
            assert got["hashes"] == want, f"rank {rank}"
            assert got["steps"] == 5
    finally:
        dep.shutdown()
    assert wait_gone(pids) == [], "actor processes left behind"
    assert shm_leftover(shm_before) == set()


@pytest.mark.parametrize("loaders,ctors", [(1, 1), ({"s0": 3, "s1": 2, "s2": 4}, 2)])
def test_any_actor_counts_give_the_embedded_batches(cluster, corpus2, loaders, ctors):
    cfg = corpus2.config(train_steps=6, topology={"dp": 2}, balance="karmarkar_karp",
                         global_batch_size=8, micro_batch_size=2)
    with pr.launch(cfg, num_source_loaders=loaders, num_constructors=ctors, namespace=NS,
                   name=f"counts{ctors}", max_source_loader_actors=3 if ctors == 2 else None) as dep:
        assert len(dep.actors["source_loader"]) == (1 * 3 if ctors == 1 else 3)
        clients = [pr.Client(cfg, rank=r, namespace=NS, name=f"counts{ctors}") for r in (0, 1)]
        got = {0: [], 1: []}
        while True:  # interleaved, as trainers run
            b = [c.next_batch() for c in clients]
            if b[0] is None:
                assert b[1] is None
                break
            for r in (0, 1):
                got[r].append(batch_hash(b[r]))
        for r in (0, 1):
            assert got[r] == loader_hashes(cfg, r)[0], f"rank {r}"
        st = clients[0].stats()
        with polyload.Loader(cfg, rank=0) as loader:
            list(loader)
            want = loader.stats()
        for key in ("steps", "tokens", "padding_fraction", "skipped", "imbalance", "sources"):
            assert st[key] == want[key], key


def test_state_round_trip_and_restart(cluster, corpus2):
    cfg = corpus2.config(train_steps=7)
    ref, _ = loader_hashes(cfg, 1)
    nmb = 2
    with pr.launch(cfg, num_source_loaders=2, namespace=NS, name="state") as dep:
        c = pr.Client(cfg, rank=1, namespace=NS, name="state")
        head = client_hashes(c, 5)  # mid-step cut: step 2, micro-batch 1
        state = c.state_dict()
        _, want_state = loader_hashes(cfg, 1, n=5)
        assert state == want_state  # the embedded loader's blob, byte for byte
        assert head == ref[:5]
        # keep going a bit, then restart the same deployment from the saved state
        client_hashes(c, 3)
        c.load_state_dict(state)
        assert client_hashes(c) == ref[5:]
        assert dep.state_dict()["blob"][:4] == b"PLST"
    # a fresh deployment continues exactly from the state (any rank, any process)
    with pr.launch(cfg, num_source_loaders=1, num_constructors=2, namespace=NS, name="state2"):
        clients = [pr.Client(cfg, rank=r, namespace=NS, name="state2") for r in (0, 1)]
        for cl in clients:  # every rank loads the same state: one restart
            cl.load_state_dict(state)
        tail1 = client_hashes(clients[1])
        tail0 = client_hashes(clients[0])
        assert tail1 == ref[5:]
        assert tail0 == loader_hashes(cfg, 0, state=state)[0]
        assert len(ref[:5] + tail1) == 7 * nmb
        with pytest.raises(polyload.StateError):
            clients[0].load_state_dict({"version": 1, "blob": state["blob"][:-1] + b"x"})
        bad = corpus2.config(train_steps=7, seed=99)
        with polyload.Loader(bad, rank=0) as other:
            with pytest.raises(polyload.StateError, match="seed|fingerprint"):
                clients[0].load_state_dict(other.state_dict())


def test_mid_step_state_with_new_weights_equals_embedded(cluster, corpus2):
    """A state taken in the middle of step 2, loaded into a deployment with other
    weights: step 2 ends as first planned (the planner actor keeps the step's start with
    the weights it began with), then the new weights; the batches equal the embedded
    loader's, rank by rank."""
    cfg = corpus2.config(train_steps=7)
    other = dict(cfg, sources=[dict(x, weight=w)
                               for x, w in zip(cfg["sources"], (0.1, 0.2, 0.7))])
    _, state = loader_hashes(cfg, 1, n=5)  # step 2, micro-batch 1
    assert _core.state_info(state["blob"])["micro_batch"] == 1
    want = {r: loader_hashes(other, r, state=state)[0] for r in (0, 1)}
    same = loader_hashes(cfg, 1, state=state)[0]
    assert want[1][:1] == same[:1] and want[1][1:] != same[1:]  # new weights from step 3
    with pr.launch(other, num_source_loaders=2, num_constructors=2, namespace=NS,
                   name="reweight"):
        clients = [pr.Client(other, rank=r, namespace=NS, name="reweight") for r in (0, 1)]
        for cl in clients:
            cl.load_state_dict(state)
        got = {r: client_hashes(clients[r]) for r in (1, 0)}
        assert got == want
        end = clients[0].state_dict()
    assert end == loader_hashes(other, 0, state=state)[1]  # the same bytes


def test_actor_errors_are_polyload_exceptions(cluster, tmp_path):
    """A corrupt record hit by a source loader reaches the trainer as the Loader's
    FormatError, with the same message (file, record, offset)."""
    prefix = str(tmp_path / "bad")
    lengths = [5] * 40
    write_megatron(prefix, lengths)
    with open(prefix + ".idx", "r+b") as f:  # pointer of record 3 far past the .bin's end
        f.seek(9 + 8 + 1 + 8 + 8 + 4 * len(lengths) + 8 * 3)
        f.write(np.int64(1 << 40).tobytes())
    cfg = {"seed": 1, "seq_length": 16, "global_batch_size": 2, "micro_batch_size": 1,
           "train_steps": 30, "topology": {"dp": 2},
           "sources": [{"name": "bad", "type": "megatron", "path": prefix, "weight": 1.0}]}
    with polyload.Loader(cfg, rank=0) as loader, pytest.raises(polyload.FormatError) as want:
        list(loader)
    with polyload.Loader(cfg, rank=0) as loader:
        want_hashes, _ = _hashes_until_error(loader)
    with pr.launch(cfg, num_source_loaders=2, namespace=NS, name="err") as dep:
        c = pr.Client(cfg, rank=0, namespace=NS, name="err")
        with pytest.raises(polyload.FormatError) as got:
            list(c)
        assert type(got.value) is polyload.FormatError
        assert "bad.idx" in got.value.message and "record 3" in got.value.message
        assert got.value.code == want.value.code
        assert got.value.message == want.value.message
        # a client with another config is refused
        other = dict(cfg, global_batch_size=4)
        with pytest.raises(polyload.ConfigError):
            pr.Client(other, rank=0, namespace=NS, name="err")
        # ... also when only a setting that changes the batches' contents differs
        for key, value in (("seed", 2), ("seq_length", 32), ("packing", "concat_chunk")):
            with pytest.raises(polyload.ConfigError, match="fingerprint"):
                pr.Client(dict(cfg, **{key: value}), rank=0, namespace=NS, name="err")
        # ... or when a source is named otherwise (the names travel as a digest; the
        # message still names both lists)
        renamed = dict(cfg, sources=[dict(cfg["sources"][0], name="other")])
        with pytest.raises(polyload.ConfigError, match=r"\['other'\] vs \['bad'\]"):
            pr.Client(renamed, rank=0, namespace=NS, name="err")
        ok = pr.Client(dict(cfg, threads=1, prefetch=2), rank=0, namespace=NS, name="err")
        # a client keeps the layout without per-source lists
        assert "partitions" not in ok.info and "sources" not in ok.info
        assert ok.info["num_sources"] == 1 and ok.info["constructors"] == dep.info["constructors"]
        # it continues near where rank 0's trainer stopped (the steps before the bad
        # record were delivered; the last 250 ms of them may come again): the same
        # batches up to the same error, which comes at a batch, not at its start
        again, again_err = _hashes_until_error(ok)
        assert again_err is not None and again_err.message == want.value.message
        assert again == want_hashes[len(want_hashes) - len(again):]
        ok.close()
        assert dep.info["num_constructors"] == 1
        # a deployment launched by a polyload whose actor calls differ (an older one,
        # left running detached) is refused at connect, naming both versions
        planner = ray.get_actor("err.planner", namespace=NS)
        full = ray.get(planner.info.remote())
        from polyload.ray._protocol import PROTOCOL

        assert full["protocol"] == PROTOCOL
        older = {k: v for k, v in full.items() if k not in ("protocol", "polyload_version")}
        ray.get(planner.set_info.remote(older))
        with pytest.raises(polyload.ConfigError, match=r"protocol 1\).*polyload .*protocol 2"):
            pr.Client(cfg, rank=0, namespace=NS, name="err")
        ray.get(planner.set_info.remote(full))
    with pytest.raises(polyload.PolyloadError, match="shut down"):  # after shutdown
        dep.state_dict()
    with pytest.raises(polyload.ConfigError):  # a missing source: before any actor starts
        pr.launch(dict(cfg, sources=[dict(cfg["sources"][0], path=prefix + "_missing")]),
                  namespace=NS, name="err2")
    with pytest.raises(ValueError):  # nothing was left running
        ray.get_actor("err2.planner", namespace=NS)


def _interleaved(clients, record_state=False):
    """Drain clients in lockstep (as trainers run); per rank the batch hashes and,
    with record_state, the state blob after every micro-batch."""
    got = {c.rank: [] for c in clients}
    states = {c.rank: [] for c in clients}
    live = list(clients)
    while live:
        for c in list(live):
            b = c.next_batch()
            if b is None:
                live.remove(c)
                continue
            got[c.rank].append(batch_hash(b))
            if record_state:
                states[c.rank].append(c.state_dict()["blob"])
    return got, states


@pytest.mark.parametrize("topology,consumers", [
    ({"dp": 2, "cp": 2, "tp": 2}, None),             # 2x2x2x1: every rank consumes
    ({"dp": 2, "pp": 3}, "first_last"),              # a middle stage that never consumes
])
def test_topologies_equal_embedded(cluster, corpus2, topology, consumers):
    """Ray and embedded batch hashes, stats() and state blobs (byte for byte, at every
    consumed position) are equal for dp x cp x tp and dp x pp topologies."""
    cfg = corpus2.config(train_steps=4, topology=topology, global_batch_size=8,
                         micro_batch_size=2, seq_length=64)
    world = int(np.prod(list(topology.values())))
    name = "topo" + "".join(str(v) for v in topology.values())
    with pr.launch(cfg, num_source_loaders=2, num_constructors=2, namespace=NS, name=name):
        ranks = list(range(world))
        if consumers == "first_last":
            ranks = [r for r in ranks if polyload._make_config(cfg).rank_info(r)["pp_rank"] != 1]
        clients = [pr.Client(cfg, rank=r, namespace=NS, name=name) for r in ranks]
        got, states = _interleaved(clients, record_state=True)
        for c in clients:
            want, want_states, want_stats = _loader_run(cfg, c.rank)
            assert got[c.rank] == want, f"rank {c.rank}"
            assert states[c.rank] == want_states, f"rank {c.rank}: state blobs differ"
            st = c.stats()
            for key in ("steps", "tokens", "padding_fraction", "skipped", "imbalance", "sources"):
                assert st[key] == want_stats[key], (c.rank, key)
            c.close()


def test_late_starter_and_lag_limit(cluster, corpus2):
    """A rank whose Client starts 20 steps after its DP peer is served from its position;
    beyond max_lag_steps it alone gets LagError and its peer keeps going."""
    cfg = corpus2.config(train_steps=60, topology={"dp": 1, "tp": 2}, global_batch_size=4,
                         micro_batch_size=2)
    want1 = loader_hashes(cfg, 1)[0]
    with pr.launch(cfg, namespace=NS, name="late", max_lag_steps=25, prefetch_steps=4):
        c0 = pr.Client(cfg, rank=0, namespace=NS, name="late")
        head = client_hashes(c0, 2 * 20)
        with pr.Client(cfg, rank=1, namespace=NS, name="late") as c1:
            assert client_hashes(c1, 10) == want1[:10]
            assert head == loader_hashes(cfg, 0, n=40)[0]
            # rank 1 stands at step 5 (its client fetched a few steps past its window:
            # a burst of 2 and two calls of 2 in flight); c0 runs 55 steps ahead
            rest = client_hashes(c0)
            assert len(head) + len(rest) == 120
            more = []
            with pytest.raises(polyload.LagError, match="max_lag_steps=29"):  # 25 + 2 calls
                while True:  # what c1 had prefetched, then the error
                    more.append(batch_hash(c1.next_batch()))
            assert more == want1[10:10 + len(more)] and len(more) <= 2 * 12
        c0.close()


@pytest.mark.parametrize("bad_step", [2, 9])
def test_error_at_a_later_step_of_a_fetch_comes_at_that_step(cluster, tmp_path, bad_step):
    """A step that fails in the middle of a fetch of several steps: the steps before it
    reach the trainer, and the error comes at the step that failed, as in the embedded
    loader (before: at the first step of the fetch, and the batches before it were
    lost).  The Client's first calls ask for 4 and 8 steps: step 2 fails inside the
    first call, step 9 inside the second."""
    prefix = str(tmp_path / "bad")
    lengths = [8] * 64
    write_megatron(prefix, lengths)
    cfg = {"seed": 3, "seq_length": 16, "global_batch_size": 2, "micro_batch_size": 1,
           "train_steps": 30, "topology": {"dp": 2}, "long_documents": "split",
           "sources": [{"name": "bad", "type": "megatron", "path": prefix, "weight": 1.0}]}
    # the record that makes rank 0 fail first at bad_step: each one corrupted in turn
    # (its pointer far past the .bin's end) until the embedded loader fails there
    idx_off = 9 + 8 + 1 + 8 + 8 + 4 * len(lengths)
    with open(prefix + ".idx", "rb") as f:
        orig = f.read()
    chosen = None
    for rec in range(len(lengths)):
        with open(prefix + ".idx", "wb") as f:
            f.write(orig[:idx_off + 8 * rec] + np.int64(1 << 40).tobytes()
                    + orig[idx_off + 8 * rec + 8:])
        with polyload.Loader(cfg, rank=0) as loader:
            got, err = _hashes_until_error(loader)
        if err is not None and len(got) == bad_step:  # one micro-batch per step
            chosen = rec
            break
    assert chosen is not None, "no record fails first at that step"
    want, want_err = {0: got}, {0: err}
    assert isinstance(err, polyload.FormatError)
    with polyload.Loader(cfg, rank=1) as loader:  # the planner fails there: rank 1 too
        want[1], want_err[1] = _hashes_until_error(loader)
    assert len(want[1]) == bad_step and isinstance(want_err[1], polyload.FormatError)
    # one constructor serves both DP ranks: rank 1 comes to the step after rank 0 failed
    with pr.launch(cfg, num_source_loaders=1, namespace=NS, name="laterr"):
        for rank in (0, 1):
            with pr.Client(cfg, rank=rank, namespace=NS, name="laterr") as c:
                got, err = _hashes_until_error(c)
            assert type(err) is type(want_err[rank])
            assert err.message == want_err[rank].message
            assert got == want[rank]  # the steps before the bad one, then the error


def test_resume_twice_from_one_checkpoint(cluster, corpus2):
    cfg = corpus2.config(train_steps=6)
    ref, _ = loader_hashes(cfg, 0)
    with pr.launch(cfg, namespace=NS, name="twice"):
        c = pr.Client(cfg, rank=0, namespace=NS, name="twice")
        client_hashes(c, 3)
        ck = c.state_dict()
        for _ in range(2):  # resume from the same checkpoint twice
            c.load_state_dict(ck)
            assert client_hashes(c) == ref[3:]
        c.close()


def test_on_error_skip_in_the_deployment(cluster, tmp_path):
    prefix = str(tmp_path / "bad")
    lengths = [5 + (i % 7) for i in range(40)]
    write_megatron(prefix, lengths)
    with open(prefix + ".idx", "r+b") as f:  # pointer of record 3 far past the .bin's end
        f.seek(9 + 8 + 1 + 8 + 8 + 4 * len(lengths) + 8 * 3)
        f.write(np.int64(1 << 40).tobytes())
    cfg = {"seed": 1, "seq_length": 16, "global_batch_size": 2, "micro_batch_size": 1,
           "train_steps": 30, "topology": {"dp": 2}, "on_error": "skip",
           "sources": [{"name": "bad", "type": "megatron", "path": prefix, "weight": 1.0}]}
    want, _, want_stats = _loader_run(cfg, 0)
    assert want_stats["skipped"] >= 1
    with pr.launch(cfg, num_source_loaders=2, namespace=NS, name="skip"):
        with pr.Client(cfg, rank=0, namespace=NS, name="skip") as c:
            assert client_hashes(c) == want
            assert c.stats()["skipped"] == want_stats["skipped"]


def test_replaced_bin_is_read_from_what_was_opened(cluster, tmp_path):
    """A .bin replaced during a run (rsync, mv of a new file): the source loaders read the
    file they opened, so the batches stay the embedded loader's (before: silently wrong)."""
    import shutil

    (tmp_path / "c").mkdir()
    corpus = Corpus(tmp_path / "c", sizes=(60, 40, 80), seed=11)
    cfg = corpus.config(train_steps=30)  # most steps are read after the replacement
    want = loader_hashes(cfg, 0)[0]
    with pr.launch(cfg, num_source_loaders=2, namespace=NS, name="replaced",
                   prefetch_steps=4):
        with pr.Client(cfg, rank=0, namespace=NS, name="replaced", prefetch=1) as c:
            head = client_hashes(c, 2)
            for p in corpus.prefixes:  # new files of the same size, other tokens
                size = os.path.getsize(p + ".bin")
                with open(p + ".bin.new", "wb") as f:
                    f.write(np.full(size, 0x5A, dtype=np.uint8).tobytes())
                os.replace(p + ".bin.new", p + ".bin")
            rest = client_hashes(c)
    assert head + rest == want
    with polyload.Loader(cfg, rank=0) as fresh:  # a new reader sees the new bytes
        assert [batch_hash(b) for b in fresh][4:] != want[4:]
    shutil.rmtree(tmp_path / "c", ignore_errors=True)
