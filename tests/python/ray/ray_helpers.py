"""Helpers shared by the tests of polyload.ray (the fixtures ``cluster`` and ``corpus2``
are in tests/python/conftest.py)."""

import os
import signal
import time

import polyload

import ray
from conftest import MiB, NS, batch_hash  # noqa: F401 - MiB: the tests import it here


def loader_hashes(cfg, rank, state=None, n=None):
    with polyload.Loader(cfg, rank=rank) as loader:
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for b in loader:
            out.append(batch_hash(b))
            if n is not None and len(out) == n:
                break
        return out, loader.state_dict()


def client_hashes(client, n=None):
    out = []
    for b in client:
        out.append(batch_hash(b))
        if n is not None and len(out) == n:
            break
    return out


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
    return True


def wait_gone(pids, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


PLACEMENT = {"planner": {"resources": {"head_node": 0.01}},
             "source_loader": {"resources": {"loader_node": 0.01}},
             "constructor": {"resources": {"ctor_node": 0.01}}}


def _loader_run(cfg, rank):
    with polyload.Loader(cfg, rank=rank) as loader:
        hashes, states = [], []
        for b in loader:
            hashes.append(batch_hash(b))
            states.append(loader.state_dict()["blob"])
        return hashes, states, loader.stats()


def _hashes_until_error(batches):
    """The hashes of the micro-batches before the first error, and the error."""
    out = []
    try:
        for b in batches:
            out.append(batch_hash(b))
    except polyload.PolyloadError as e:
        return out, e
    return out, None


def _pid(actor):
    """The actor's current pid (waiting while Ray restarts it)."""
    deadline = time.time() + 60
    while True:
        try:
            return int(ray.get(actor.pid.remote(), timeout=60))
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def _kill(actor):
    """SIGKILL the actor's current process (Ray restarts it)."""
    os.kill(_pid(actor), signal.SIGKILL)


def _lockstep(clients, each=None):
    """Drain clients in lockstep, as trainers run: per rank the batch hashes; ``each(k,
    batches)`` runs after the k-th micro-batch of every rank (k from 1)."""
    got = {c.rank: [] for c in clients}
    k = 0
    while True:
        b = [c.next_batch() for c in clients]
        if b[0] is None:
            return got
        for c, x in zip(clients, b):
            got[c.rank].append(batch_hash(x))
        k += 1
        if each is not None:
            each(k, b)


def _names_gone(names, timeout=20):
    """Wait until no actor holds these names (killed for good); the names still held."""
    deadline, left = time.time() + timeout, set(names)
    while left and time.time() < deadline:
        for n in list(left):
            try:
                ray.get_actor(n, namespace=NS)
            except ValueError:  # a name is released once its actor is dead
                left.discard(n)
        time.sleep(0.2)
    return left
