"""Shared fixtures for the Python tests.

Tests import the installed ``polyload`` (``make test`` installs it into .venv); when it is
not installed, the pure-Python modules are taken from the source tree.
"""

import importlib.util
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if importlib.util.find_spec("polyload") is None:
    sys.path.insert(0, os.path.join(ROOT, "python"))


# ---------------------------------------------------------------- Megatron fixtures
# (used by test_core.py, test_loader.py and test_megatron_compat.py)

import struct  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

#: Token k of source s (counted across its documents) is SOURCE_BASE * (s + 1) + k.
SOURCE_BASE = 100_000_000

_MEGATRON_CODES = {
    np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5,
    np.float64: 6, np.float32: 7, np.uint16: 8,
}


def write_megatron(prefix, lengths, base=0, dtype=np.int32):
    """Write ``prefix.bin``/``prefix.idx`` as megatron-core's IndexedDatasetBuilder does
    (MMIDIDX version 1, one sequence per document).  Token k of the file is base + k.
    Returns the token offset of each document (len(lengths) + 1 entries)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    tokens = (base + np.arange(starts[-1], dtype=np.int64)).astype(dtype)
    tokens.tofile(f"{prefix}.bin")
    itemsize = np.dtype(dtype).itemsize
    n = len(lengths)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", _MEGATRON_CODES[np.dtype(dtype).type]))
        f.write(struct.pack("<Q", n))
        f.write(struct.pack("<Q", n + 1))
        f.write(lengths.astype(np.int32).tobytes())
        f.write((starts[:-1] * itemsize).astype(np.int64).tobytes())
        f.write(np.arange(n + 1, dtype=np.int64).tobytes())
    return starts


class Corpus:
    """Three Megatron int32 sources in a directory; ``token(s, index, offset)`` is the
    value stored at that position (SOURCE_BASE * (s + 1) + its position in the file)."""

    NSRC = 3

    def __init__(self, directory, seq_length=64, sizes=(97, 61, 150), seed=7):
        self.dir = str(directory)
        self.seq_length = seq_length
        rng = np.random.default_rng(seed)
        self.lengths, self.starts, self.prefixes = [], [], []
        for s, n in enumerate(sizes):
            lens = rng.integers(1, seq_length // 2 + 1, size=n)
            long = rng.random(n) < 0.08
            lens[long] = rng.integers(seq_length, 4 * seq_length, size=int(long.sum()))
            if s == 1:
                lens = 1 + lens // 4
            prefix = os.path.join(self.dir, f"src{s}")
            self.starts.append(write_megatron(prefix, lens, SOURCE_BASE * (s + 1)))
            self.lengths.append(lens)
            self.prefixes.append(prefix)

    def token(self, s, index, offset):
        return SOURCE_BASE * (s + 1) + int(self.starts[s][index]) + offset

    def tokens(self, s, index, offset, length):
        start = SOURCE_BASE * (s + 1) + int(self.starts[s][index]) + offset
        return np.arange(start, start + length, dtype=np.int64)

    def config(self, **overrides):
        """A config dict over the corpus (SPEC section 5); keyword arguments override."""
        cfg = {
            "seed": 1234,
            "seq_length": self.seq_length,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "train_steps": 12,
            "topology": {"dp": 2, "pp": 1, "cp": 1, "tp": 1},
            "threads": 2,
            "prefetch": 3,
            "sources": [
                {"name": f"s{s}", "type": "megatron", "path": p, "weight": w}
                for s, (p, w) in enumerate(zip(self.prefixes, (0.5, 0.2, 0.3)))
            ],
        }
        cfg.update(overrides)
        return cfg


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return Corpus(tmp_path_factory.mktemp("corpus"))


def batch_hash(b):
    """sha256 over a micro-batch dict (field names and bytes, in key order)."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for k in sorted(b):
        v = b[k]
        h.update(k.encode())
        h.update(v.numpy().tobytes() if isinstance(v, torch.Tensor) else str(v).encode())
    return h.hexdigest()


# ---------------------------------------------------------------- image-text fixtures
# (used by test_hf.py, test_megatron.py, test_loader.py and test_ray.py)


def write_vlm_corpus(out):
    """The real photo corpus of scripts/make_vlm_corpus.py (26 captioned photos of
    scikit-image, scikit-learn and matplotlib, 4 shards ``shard-00000{0..3}.tar``) in
    directory ``out``; returns its items (key, ext, bytes, caption, licence, origin)."""
    spec = importlib.util.spec_from_file_location(
        "make_vlm_corpus", os.path.join(ROOT, "scripts", "make_vlm_corpus.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    items = mod.samples()
    mod.write_shards(items, str(out), 8)
    return items


# ---------------------------------------------------------------- Ray fixtures
# (used by tests/python/ray/; Ray is imported by the fixtures, not here)

#: The Ray namespace of the test deployments.
NS = "polyload_test"
MiB = 1 << 20


def _own_tree():
    """Pids of this process and its descendants."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, grew = {os.getpid()}, True
    while grew:
        grew = False
        for pid, pp in parent.items():
            if pp in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


# Segments of torch.multiprocessing / multiprocessing (psm_*, sem.mp-*) and of MosaicML
# Streaming (NNNNNN_*): other jobs on a shared machine create (and leak) them in numbers
# while this test runs, and nothing of Ray or polyload is named so.
_FOREIGN_SHM = re.compile(r"^(psm_[0-9a-f]+|sem\.mp-.*|\d{6}_\w+)$")


def shm_leftover(before):
    """/dev/shm entries created since `before` that are ours: the machine's /dev/shm is
    shared with other processes (other jobs' DataLoader workers and benchmarks), so an
    entry that vanishes within a second, that a process outside this test's process
    tree holds open or mapped, or that is named as torch/multiprocessing segments are
    (_FOREIGN_SHM) is not counted as a leak of Ray or polyload."""
    new = {n for n in set(os.listdir("/dev/shm")) - before if not _FOREIGN_SHM.match(n)}
    if not new:
        return new
    time.sleep(1.0)
    new &= set(os.listdir("/dev/shm"))
    tree = _own_tree()
    foreign = set()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in tree:
            continue
        try:
            held = {os.path.basename(os.readlink(f"/proc/{d}/fd/{fd}"))
                    for fd in os.listdir(f"/proc/{d}/fd")}
            with open(f"/proc/{d}/maps") as f:
                held |= {line.rsplit("/", 1)[-1].strip() for line in f if "/dev/shm/" in line}
        except OSError:
            continue
        foreign |= new & held
    return new - foreign


@pytest.fixture(scope="session")
def cluster():
    """Three Ray nodes on this machine: the head (planner, drivers), a "loader" node and a
    "constructor" node, told apart by custom resources.  The nodes and this process run
    with polyload.ray.FAILURE_DETECTION_ENV (set before Ray starts, as launch does)."""
    ray = pytest.importorskip("ray")
    pr = pytest.importorskip("polyload.ray")
    from ray.cluster_utils import Cluster

    pr.set_failure_detection_env()

    shm_before = set(os.listdir("/dev/shm"))
    node = {"num_cpus": 8, "object_store_memory": 256 * MiB}
    c = Cluster(initialize_head=True,
                head_node_args={**node, "include_dashboard": False, "resources": {"head_node": 1}})
    c.add_node(**node, resources={"loader_node": 1})
    c.add_node(**node, resources={"ctor_node": 1})
    c.wait_for_nodes()
    ray.init(address=c.address, namespace=NS, log_to_driver=False)
    nodes = {}
    for n in ray.nodes():
        for key in ("head_node", "loader_node", "ctor_node"):
            if key in n["Resources"]:
                nodes[key] = n["NodeID"]
    c.node_ids = nodes
    yield c
    # A Client a test left open keeps threads that would call the deployment after
    # ray.shutdown(): such a call connects the process again, and removing the nodes then
    # fails ("Removing a node that is connected to this Ray client").
    import gc  # noqa: PLC0415

    for obj in gc.get_objects():
        if issubclass(type(obj), pr.Client):  # type(): no attribute lookups on obj
            obj.close()
    ray.shutdown()
    c.shutdown()
    time.sleep(0.5)
    leftover = shm_leftover(shm_before)
    assert not leftover, f"shared-memory segments left behind: {sorted(leftover)}"


@pytest.fixture(scope="module")
def corpus2(tmp_path_factory):
    return Corpus(tmp_path_factory.mktemp("ray_corpus"), sizes=(120, 80, 160), seed=3)
