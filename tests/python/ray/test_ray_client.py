"""A trainer's Client: bounded memory whatever its rank consumes, no data files needed on
its node, its prefetch window, a client started again for its rank, the reports of
finished steps, an unreachable cluster, and the Ray layer parsing no C format."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import polyload
from polyload import _core

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pr = pytest.importorskip("polyload.ray")

from conftest import batch_hash  # noqa: E402
from ray_helpers import NS, MiB, loader_hashes, client_hashes  # noqa: E402


def _rss(pid):
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_never_consuming_rank_keeps_memory_bounded(cluster, corpus2):
    """tp=2, rank 1 never asks: over 1,000 steps the constructor's ledger and RSS stay
    bounded in the deployment and in the embedded loader; rank 1 alone gets LagError."""
    cfg = corpus2.config(train_steps=1000, topology={"dp": 1, "tp": 2}, global_batch_size=2,
                         micro_batch_size=1, seq_length=32, max_lag_steps=8)
    # prefetch_steps as the default was before 2026-12-03 (64): the planner then keeps
    # 8 + 4 * 64 states, fewer than the run's 1,000 steps, so their bound is checked
    with pr.launch(cfg, namespace=NS, name="bounded", prefetch_steps=64) as dep:
        ctor = dep.actors["constructor"][0]
        c0 = pr.Client(cfg, rank=0, namespace=NS, name="bounded")
        mem = []
        for i, _ in enumerate(c0):
            if i % 200 == 199:
                mem.append(ray.get(ctor.memory.remote()))
        assert i + 1 == 2000
        ledger = [m["pipeline_bytes"] for m in mem]
        half = len(ledger) // 2  # no growth: the second half holds no more than the first
        assert max(ledger[half:]) <= max(ledger[:half]) + 4096, ledger
        rss = [m["rss_bytes"] for m in mem]
        assert rss[-1] - rss[0] < 32 * MiB, rss
        # The planner keeps the states a rank may still stand at, no more: packed,
        # within keep_steps of the newest step, however long the run.
        pm = ray.get(dep.actors["planner"][0].memory.remote())
        assert 0 < pm["states_kept"] <= pm["keep_steps"] + 1, pm
        assert pm["states_kept"] < 1000
        blob = c0.state_dict()["blob"]  # its step's state comes from the planner
        assert _core.state_info(blob)["step"] == 1000
        c1 = pr.Client(cfg, rank=1, namespace=NS, name="bounded")
        with pytest.raises(polyload.LagError, match=r"rank 1 .*max_lag_steps=\d+"):
            c1.next_batch()
        c0.close()
        c1.close()
    # The embedded loader, same policy: rank 1 served but never consuming.
    with polyload.Loader(cfg, rank=0, ranks=[0, 1]) as loader:
        pid = os.getpid()
        n = 0
        for _ in loader:
            n += 1
            if n == 200:
                r0 = _rss(pid)
        assert n == 2000
        assert _rss(pid) - r0 < 32 * MiB
        with pytest.raises(polyload.LagError):
            loader.next_batch(1)


def test_client_without_the_data_files(cluster, corpus2, tmp_path, monkeypatch):
    """Relative source paths, a deployment launched where they exist, a Client in a
    directory where they do not: the config parses and the Client gets the batches."""
    root = os.path.dirname(corpus2.prefixes[0])
    cfg = corpus2.config(train_steps=3)
    cfg["sources"] = [dict(s, path=os.path.relpath(s["path"], root)) for s in cfg["sources"]]
    monkeypatch.chdir(root)
    want = loader_hashes(cfg, 0)[0]
    with pr.launch(cfg, namespace=NS, name="nodata"):
        empty = tmp_path / "trainer_cwd"
        empty.mkdir()
        monkeypatch.chdir(empty)
        assert not os.path.exists(cfg["sources"][0]["path"] + ".idx")
        with pr.Client(cfg, rank=0, namespace=NS, name="nodata") as c:
            assert client_hashes(c) == want


def _prefetch_settles(c, want, timeout=30.0):
    """Client.prefetched() once ``pushed`` reached ``want`` and every fetch in flight
    arrived (or what it was at the deadline), after a second more in which nothing
    may move."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = c.prefetched()
        if p["pushed"] >= want and p["calls_done"] == p["calls"]:
            break
        time.sleep(0.05)
    time.sleep(1.0)
    return c.prefetched()


def test_client_prefetch_fills_its_window_and_keeps_the_batches(cluster, corpus2):
    """A trainer that stands still (between steps, at a checkpoint) gets its client's
    whole prefetch window expanded: the C loader's window is prefetch_batches
    micro-batches ahead (by default the steps of one fetch) plus the one consumed; the
    packages beyond it stay compact (``held`` in Python, or pushed into the C loader:
    its transport is granted steps in bursts, up to one fetch's steps past the step
    built next, ``want_steps``), and no more than that is pushed.  Before, the
    transport's want_step missed the wake-up of the worker taking the last planned
    unit and stood 1-3 steps short until the trainer moved.  Batches are the embedded
    loader's whatever the window."""
    cfg = corpus2.config(train_steps=10)  # nmb 2, seq 64: a unit is a step
    with pr.launch(cfg, namespace=NS, name="window", prefetch_steps=8):  # 4 steps a fetch
        with pytest.raises(ValueError, match="prefetch_batches"):
            pr.Client(cfg, rank=0, namespace=NS, name="window", prefetch_batches=0)
        c0 = pr.Client(cfg, rank=0, namespace=NS, name="window", prefetch_batches=3)
        c1 = pr.Client(cfg, rank=1, namespace=NS, name="window")  # 4 steps: 8 batches
        got = {0: [], 1: []}
        for c in (c0, c1):
            for _ in range(2):  # step 0 taken; the trainer stands at step 1
                got[c.rank].append(batch_hash(c.next_batch()))
        # window in steps: ceil(prefetch_batches / 2) + 1 units from the consumed one's
        for c, want in ((c0, 1 + 2 + 1), (c1, 1 + 4 + 1)):
            p = _prefetch_settles(c, want)
            # the window is built (so pushed); compact packages past it, at most one
            # fetch's steps (4) past the step built next, none past train_steps (10)
            assert want <= p["pushed"] <= min(10 + 1, want + 4), (c.rank, p)
            assert p["calls_done"] == p["calls"], (c.rank, p)
            # more fetched than the window, kept as packages (received or arrived)
            assert p["held"] > 0 or p["calls_done"] > 0, (c.rank, p)
        for c in (c0, c1):
            got[c.rank] += client_hashes(c)
            assert got[c.rank] == loader_hashes(cfg, c.rank)[0], f"rank {c.rank}"
            c.close()


def test_ray_code_parses_no_c_format():
    """The Ray layer moves bytes between C calls; it never reads a C format's layout."""
    import re

    pkg = os.path.dirname(pr.__file__)
    for fn in sorted(os.listdir(pkg)):
        if not fn.endswith(".py"):
            continue
        text = open(os.path.join(pkg, fn)).read()
        for pattern in (r"\bstruct\.", r"unpack_from", r"pack_into", r"\bzlib\b", r"crc32",
                        r"blob\[\d", r"b\"PLST\"", r"b'PLST'"):
            assert not re.search(pattern, text), f"{fn}: {pattern}"


_DYING_CLIENT = r"""
import json, os, signal, sys
sys.path.insert(0, sys.argv[5])
import ray, polyload.ray as pr
from conftest import batch_hash
ray.init(address=sys.argv[1], namespace=sys.argv[2], log_to_driver=False)
c = pr.Client(json.loads(sys.argv[3]), rank=0, namespace=sys.argv[2], name="rejoin",
              timeout=120)
out = [batch_hash(c.next_batch()) for _ in range(int(sys.argv[4]))]
print(json.dumps(out), flush=True)
# The trainer computes on its last batch, then dies mid-step without closing.  (The
# report that it finished the steps before, sent without waiting when it asked for the
# step's first micro-batch, can be lost with a process killed within microseconds of
# asking: its successor then gets one more step again, never one less.)
import time; time.sleep(0.5)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_client_started_again_continues_for_its_rank(cluster, corpus2):
    """A trainer process SIGKILLed and started again for its rank continues at the
    first micro-batch of the step it had not finished (it finished a step when it asked
    for the next step's first micro-batch; the partial step is delivered again, since
    the dead process's gradient went with it); the other rank's batches are unchanged."""
    cfg = corpus2.config(train_steps=20, topology={"dp": 2}, global_batch_size=8,
                         micro_batch_size=2, seq_length=64)
    nmb = 2
    want0, want0_state = loader_hashes(cfg, 0)
    want1, _ = loader_hashes(cfg, 1)
    with pr.launch(cfg, num_constructors=1, namespace=NS, name="rejoin", prefetch_steps=2):
        other = pr.Client(cfg, rank=1, namespace=NS, name="rejoin", timeout=120)
        got1 = client_hashes(other, 4)
        for used in (7, 6):  # mid-step (3 steps and one micro-batch), then at a boundary
            done = subprocess.run(
                [sys.executable, "-c", _DYING_CLIENT, cluster.address, NS, json.dumps(cfg),
                 str(used), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))],
                capture_output=True, text=True, timeout=300)
            assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
            head = json.loads(done.stdout.strip().splitlines()[-1])
            first = 0 if used == 7 else 6  # where this process started
            assert head == want0[first:first + used]
            if used == 7:
                got1 += client_hashes(other, 10)
        # the second process asked for micro-batches 6..11: it finished steps 3 and 4
        again = pr.Client(cfg, rank=0, namespace=NS, name="rejoin", timeout=120)
        assert again.state_dict()["blob"] == loader_hashes(cfg, 0, n=10)[1]["blob"]
        assert client_hashes(again) == want0[10:]
        got1 += client_hashes(other)
        assert got1 == want1
        assert again.state_dict()["blob"] == want0_state["blob"]
        again.close()
        other.close()


def test_finished_steps_are_reported_coalesced_and_flushed_at_close(cluster, corpus2):
    """A client reports its trainer's finished steps (DataConstructor.at, or with a
    fetch) at most once per AT_INTERVAL_S, however fast the steps go (a call per step
    took two thirds of the deployment's tokens/s), and close() sends the last one: a
    client started again for the rank continues exactly after the steps consumed."""
    from polyload.ray import _client

    cfg = corpus2.config(train_steps=400, topology={"dp": 1}, global_batch_size=2,
                         micro_batch_size=2, seq_length=32)
    want, _ = loader_hashes(cfg, 0)
    with pr.launch(cfg, num_constructors=1, namespace=NS, name="atrate") as dep:
        ctor = dep.actors["constructor"][0]
        c = pr.Client(cfg, rank=0, namespace=NS, name="atrate", timeout=120)
        before = ray.get(ctor.memory.remote())["at_calls"]
        t0 = time.monotonic()
        got = client_hashes(c, 301)  # asked for step 300's micro-batch: 0..299 done
        c.close()
        elapsed = time.monotonic() - t0
        calls = ray.get(ctor.memory.remote())["at_calls"] - before
        # fetches carry the finished steps too: separate calls may be none at all
        assert 0 <= calls <= 2 + elapsed / _client.AT_INTERVAL_S, (calls, elapsed)
        again = pr.Client(cfg, rank=0, namespace=NS, name="atrate", timeout=120)
        assert got == want[:301]
        assert client_hashes(again) == want[300:]
        again.close()


def test_client_at_an_unreachable_address_is_a_clear_error(corpus2):
    """A Client pointed at an address where no Ray cluster listens raises
    PolyloadIOError naming it at once (in a fresh process: Ray not initialized)."""
    code = ("import json, sys, polyload, polyload.ray as pr\n"
            "try:\n"
            "    pr.Client(json.loads(sys.argv[1]), address='127.0.0.1:9', timeout=5)\n"
            "except polyload.PolyloadIOError as e:\n"
            "    print('ERR', e)\n")
    t0 = time.time()
    done = subprocess.run([sys.executable, "-c", code, json.dumps(corpus2.config())],
                          capture_output=True, text=True, timeout=120)
    assert "ERR [EIO] polyload.ray.Client: no Ray cluster reachable at 127.0.0.1:9" in \
        done.stdout, done.stderr[-2000:]
    assert time.time() - t0 < 60
