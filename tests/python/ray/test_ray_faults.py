"""Failures do not change batches: kills of every role at seeded random steps, stalled and
lost source loaders and constructors moving to their standbys, two constructors taking
over at once, a lost node, and clear errors within the deadline when nothing is left."""

import os
import signal
import time

import pytest

import polyload
from polyload import _core

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pr = pytest.importorskip("polyload.ray")

from conftest import batch_hash  # noqa: E402
from ray_helpers import (  # noqa: E402
    NS, MiB, loader_hashes, client_hashes, PLACEMENT, _pid, _kill, _lockstep)


def test_kills_of_every_role_do_not_change_batches(cluster, corpus2):
    """24 SIGKILLs at seeded random steps of the planner, the constructors and the
    source loaders (primaries and standbys of both, two in one step, one right before a
    state_dict(), one at the step where the mixture schedule changes): every rank's
    batches and final state equal the embedded loader's; no client sees an exception."""
    import random

    cfg = corpus2.config(train_steps=40, topology={"dp": 2}, global_batch_size=8,
                         micro_batch_size=2, seq_length=64)
    for src in cfg["sources"]:
        src.pop("weight")
    change = 20
    cfg["schedule"] = {"interpolation": "step", "points": [
        {"step": 0, "weights": {"s0": 0.5, "s1": 0.2, "s2": 0.3}},
        {"step": change, "weights": {"s0": 0.1, "s1": 0.1, "s2": 0.8}}]}
    rng = random.Random(int(os.environ.get("POLYLOAD_KILL_SEED", "1234")))
    with pr.launch(cfg, num_source_loaders=2, num_constructors=2, namespace=NS, name="kills",
                   placement=PLACEMENT, prefetch_steps=2, checkpoint_steps=2) as dep:
        roles = dep.actors
        targets = ([("planner", a) for a in roles["planner"]]
                   + [("constructor", a) for a in roles["constructor"]]
                   + [("constructor_shadow", a) for a in roles["constructor_shadow"]]
                   + [("source_loader", a) for a in roles["source_loader"]]
                   + [("shadow", a) for a in roles["shadow"]])
        clients = [pr.Client(cfg, rank=r, namespace=NS, name="kills", timeout=120)
                   for r in range(2)]
        n_mb = 40 * 2  # micro-batches per rank
        kill_at = sorted(set(rng.sample(range(2, n_mb - 2), 22)) | {2 * change - 1})
        got = {0: [], 1: []}
        kills = []
        for k in range(n_mb):
            for c in clients:
                b = c.next_batch()
                assert b is not None
                got[c.rank].append(batch_hash(b))
            if k in kill_at:
                n = 2 if k == kill_at[3] else 1  # two failures in one step
                for role, actor in rng.sample(targets, n):
                    _kill(actor)
                    kills.append((k, role))
                if k == kill_at[5]:  # a state_dict() right after a kill
                    role, actor = next(t for t in targets if t[0] == "planner")
                    _kill(actor)
                    kills.append((k, role))
                    s0 = clients[0].state_dict()
                    assert _core.state_info(s0["blob"])["step"] == (k + 1) // 2
        assert len(kills) >= 20
        assert {r for _, r in kills} >= {"planner", "constructor", "source_loader"}
        for c in clients:
            assert c.next_batch() is None
            want, want_state = loader_hashes(cfg, c.rank)
            assert got[c.rank] == want, f"rank {c.rank} after kills {kills}"
            assert c.state_dict()["blob"] == want_state["blob"]
            c.close()
        pm = ray.get(dep.actors["planner"][0].memory.remote())
        assert pm["recovered_from"] >= 0  # the planner came back from its checkpoint


def test_stalled_source_loader_moves_to_its_standby(cluster, corpus2):
    """A SIGSTOPped source loader (no crash, no answer) counts as failed after
    read_timeout: its reads go to the standby; batches unchanged."""
    cfg = corpus2.config(train_steps=12, topology={"dp": 1}, global_batch_size=4,
                         micro_batch_size=2, seq_length=64)
    with pr.launch(cfg, num_constructors=1, namespace=NS, name="stall", prefetch_steps=1,
                   read_timeout=2.0, max_source_loader_actors=1) as dep:
        pid = _pid(dep.actors["source_loader"][0])
        c = pr.Client(cfg, rank=0, namespace=NS, name="stall", timeout=60)
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.time()
            got = client_hashes(c)
            took = time.time() - t0
        finally:
            os.kill(pid, signal.SIGCONT)
        want, _ = loader_hashes(cfg, 0)
        assert got == want
        fo = dep.failovers()
        assert fo and "read_timeout" in fo[0]["reason"] and fo[0]["to"].endswith(".shadow.0")
        assert took < 30
        c.close()


def test_constructor_lost_or_stalled_moves_to_its_standby(cluster, corpus2):
    """SIGKILL of the serving constructor, twice (the primary, then the standby serving
    for it: the primary, restarted by Ray, is then the warm standby), and a SIGSTOPped
    one (no answer within stall_timeout): the clients move to the group's next
    constructor each time; batches unchanged."""
    cfg = corpus2.config(train_steps=40, topology={"dp": 2}, global_batch_size=8,
                         micro_batch_size=2, seq_length=64)
    with pr.launch(cfg, num_constructors=1, namespace=NS, name="ctorsb", prefetch_steps=1,
                   timeout=60) as dep:
        assert len(dep.actors["constructor_shadow"]) == 1
        primary, standby = dep.actors["constructor"][0], dep.actors["constructor_shadow"][0]
        clients = [pr.Client(cfg, rank=r, namespace=NS, name="ctorsb", timeout=120,
                             prefetch=1, stall_timeout=1.0) for r in range(2)]
        got = {0: [], 1: []}
        stopped = None
        for k in range(80):
            if k == 10:
                _kill(primary)
            if k == 30:
                _pid(primary)  # back (Ray restarted it) and warm
                _kill(standby)  # serving since step 5
            if k == 50:
                _pid(standby)
                stopped = _pid(primary)  # serving again since step 15
                os.kill(stopped, signal.SIGSTOP)
            for c in clients:
                got[c.rank].append(batch_hash(c.next_batch()))
        os.kill(stopped, signal.SIGCONT)
        for c in clients:
            assert c.next_batch() is None
            assert got[c.rank] == loader_hashes(cfg, c.rank)[0]
            assert c.switches == 3, "\n".join(map(str, c.moves))
            c.close()


def test_stalled_constructor_that_resumes_stands_down(cluster, corpus2):
    """A constructor that stalls (SIGSTOP: alive, no answer) loses its group to the
    standby; when it resumes it no longer serves (it stood down), so when the standby is
    lost later the clients that move back to it find it standing where they are, not at
    the step it stopped at (it kept serving from there: every fetch waited for steps
    that would never come, ETIMEDOUT).  A new Client's start asks the serving one and
    moves nobody.  Batches unchanged."""
    cfg = corpus2.config(train_steps=30, topology={"dp": 2}, global_batch_size=8,
                         micro_batch_size=2, seq_length=64)
    with pr.launch(cfg, num_constructors=1, namespace=NS, name="standsdown", prefetch_steps=1,
                   timeout=60) as dep:
        primary, standby = dep.actors["constructor"][0], dep.actors["constructor_shadow"][0]
        clients = [pr.Client(cfg, rank=r, namespace=NS, name="standsdown", timeout=20,
                             prefetch=1, stall_timeout=1.0) for r in range(2)]
        got = {0: [], 1: []}
        stopped = _pid(primary)
        for k in range(60):
            if k == 10:
                os.kill(stopped, signal.SIGSTOP)
            if k == 24:
                assert [c.switches for c in clients] == [1, 1], [(m["from"][-8:], m["step"], m["reason"]) for c in clients for m in c.moves]
                os.kill(stopped, signal.SIGCONT)
                deadline = time.time() + 20  # it answers its queued calls, stand_down too
                while ray.get(primary.position.remote(), timeout=20) is not None:
                    assert time.time() < deadline, "the resumed constructor still serves"
                    time.sleep(0.1)
                gen = ray.get(dep.actors["planner"][0].current.remote())[0]
                assert ray.get(primary.rejoin.remote(gen, 0, False)) is None
                assert ray.get(standby.rejoin.remote(gen, 0, False))[0] == gen
            if k == 30:
                _kill(standby)
            for c in clients:
                got[c.rank].append(batch_hash(c.next_batch()))
        for c in clients:
            assert c.next_batch() is None
            assert got[c.rank] == loader_hashes(cfg, c.rank)[0]
            assert [m["reason"] for m in c.moves][0] == "_Stalled"
            assert c.switches >= 2, c.moves
            c.close()


def _serving(actors):
    return [ray.get(a.position.remote(), timeout=30) is not None for a in actors]


def _settle(actors, want=None, timeout=20):
    deadline = time.time() + timeout
    while True:
        got = _serving(actors)
        if (want is None and sum(got) == 1) or got == want or time.time() > deadline:
            return got
        time.sleep(0.1)


def test_two_constructors_taking_over_at_once_leave_one_serving(cluster, corpus2):
    """Take-overs are ordered by when they happened: of two constructors of a group
    that take over at once, the later one serves and the other stands down (each
    standing the other down left none serving, so that every client bounced between
    them); a stand-down from an earlier take-over that arrives late (a call queued
    while the constructor was stopped) is ignored.  Clients then go where the one
    that stood down points them; batches unchanged."""
    cfg = corpus2.config(train_steps=12, topology={"dp": 2}, global_batch_size=8,
                         micro_batch_size=2, seq_length=64)
    with pr.launch(cfg, num_constructors=1, namespace=NS, name="bothtake", prefetch_steps=1,
                   timeout=60) as dep:
        grp = [dep.actors["constructor"][0], dep.actors["constructor_shadow"][0]]
        before = time.time()
        ray.get(grp[1].position.remote(True), timeout=30)  # the standby takes over
        assert _settle(grp, [False, True]) == [False, True]
        ray.get(grp[0].position.remote(True), timeout=30)  # and the primary again
        assert _settle(grp, [True, False]) == [True, False]
        ray.get(grp[0].stand_down.remote((before, "late")), timeout=30)  # older: ignored
        got = _serving(grp)
        assert got == [True, False]
        for _ in range(3):
            ray.get(grp[got.index(True)].stand_down.remote(), timeout=30)  # none serves
            assert _serving(grp) == [False, False]
            ray.get([a.position.remote(True) for a in grp], timeout=30)  # both at once
            got = _settle(grp)
            assert sum(got) == 1, got
        clients = [pr.Client(cfg, rank=r, namespace=NS, name="bothtake", timeout=30,
                             prefetch=1) for r in range(2)]
        assert all(c._ci == got.index(True) for c in clients)
        got_b = {0: [], 1: []}
        for k in range(24):
            if k == 6:  # the one not serving takes over: the clients follow it
                ray.get(grp[got.index(False)].position.remote(True), timeout=30)
            for c in clients:
                got_b[c.rank].append(batch_hash(c.next_batch()))
        for c in clients:
            assert c.next_batch() is None
            assert got_b[c.rank] == loader_hashes(cfg, c.rank)[0]
            assert [m["reason"] for m in c.moves] == ["StoodDown"], c.moves
            c.close()


def test_every_source_loader_gone_is_a_clear_error_within_the_deadline(cluster, corpus2):
    """Primaries and standbys killed for good: the rank that reaches an unread step gets
    PolyloadIOError naming the constructor and the actors tried, within seconds."""
    cfg = corpus2.config(train_steps=200, topology={"dp": 1}, global_batch_size=4,
                         micro_batch_size=2, seq_length=64)
    with pr.launch(cfg, num_constructors=1, namespace=NS, name="gone", prefetch_steps=1,
                   read_timeout=2.0) as dep:
        c = pr.Client(cfg, rank=0, namespace=NS, name="gone", timeout=60, prefetch=1)
        next(c)
        for a in dep.actors["source_loader"] + dep.actors["shadow"]:
            ray.kill(a, no_restart=True)
        t0 = time.time()
        with pytest.raises(polyload.PolyloadIOError, match=r"no source loader could read.*shadow"):
            for _ in range(400):
                c.next_batch()
        assert time.time() - t0 < 30
        c.close()


def test_lost_node_with_every_primary_source_loader(cluster, corpus2):
    """The node that hosts every primary source loader is removed without grace
    mid-run: reads go to the standbys on another node; batches unchanged."""
    node = cluster.add_node(num_cpus=4, object_store_memory=128 * MiB, resources={"doomed": 1})
    cluster.wait_for_nodes()
    cfg = corpus2.config(train_steps=30, topology={"dp": 2}, global_batch_size=8,
                         micro_batch_size=2, seq_length=64)
    placement = {"source_loader": {"resources": {"doomed": 0.01}},
                 "shadow": {"resources": {"loader_node": 0.01}}}
    with pr.launch(cfg, num_constructors=1, namespace=NS, name="node",
                   placement=placement, prefetch_steps=1, timeout=60) as dep:
        clients = [pr.Client(cfg, rank=r, namespace=NS, name="node", timeout=120)
                   for r in range(2)]
        got = {0: [], 1: []}
        for k in range(60):
            if k == 10:
                cluster.remove_node(node, allow_graceful=False)
                # A lost machine takes its processes along; the local "node" leaves its
                # workers running until they notice, so end them as the machine would.
                for pid in dep.info["pids"]["source_loader"]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for c in clients:
                got[c.rank].append(batch_hash(c.next_batch()))
        for c in clients:
            assert c.next_batch() is None
            assert got[c.rank] == loader_hashes(cfg, c.rank)[0]
            c.close()
        fo = dep.failovers()
        assert fo and all(".shadow." in f["to"] for f in fo), (fo, dep.info["nodes"], node.node_id)


def test_raw_text_lengths_move_to_a_standby(cluster, tmp_path_factory):
    """The planner's lengths calls for a raw text source whose loader is killed move to
    its standby (and the reads too): batches equal the embedded loader's."""
    import fortunes_corpus as fc

    corpus = fc.build(tmp_path_factory.mktemp("ray_lengths_fail"))
    cfg = fc.config(corpus, train_steps=12, tokenizer={"type": "hf", "path": corpus["tokenizer"]})
    cfg["sources"] = [
        {"name": n, "type": "jsonl", "path": os.path.join(corpus["dir"], f"{n}.jsonl"),
         "weight": w, "lookahead": 8} for n, w in (("tech", 0.6), ("wit", 0.4))]
    want = {r: loader_hashes(cfg, r)[0] for r in (0, 1)}
    with pr.launch(cfg, num_source_loaders=1, namespace=NS, name="lenfail", shadows=1,
                   prefetch_steps=1, read_timeout=5.0) as dep:
        clients = [pr.Client(cfg, rank=r, namespace=NS, name="lenfail") for r in (0, 1)]
        before = ray.get([a.tokenizers.remote() for a in dep.actors["shadow"]])

        def each(k, _b):
            if k == 2:
                for pid in dep.pids()["source_loader"]:
                    os.kill(pid, signal.SIGKILL)
        got = _lockstep(clients, each)
        after = ray.get([a.tokenizers.remote() for a in dep.actors["shadow"]])
    for r in (0, 1):
        assert got[r] == want[r], f"rank {r}"
    # The standby opened its sources (loading the tokenizer once to check them), then
    # unloaded it; taking over, it loaded it again to tokenize.
    assert all(not t["loaded"] and t["loads"] == 1 for h in before for t in h.values()), before
    assert any(t["loaded"] and t["loads"] == 2 for h in after for t in h.values()), after
