"""polyload._core: exceptions, zero-copy batches, buffer lifetime, leaks, the GIL, fork.

Fixtures are Megatron datasets whose token value is its position (conftest.Corpus).
"""

import errno
import gc
import ctypes
import os
import pickle
import shutil
import sys
import threading

import numpy as np
import pytest

import polyload
from polyload import _core

torch = pytest.importorskip("torch")


def core_config(d):
    import yaml

    return _core.Config.parse_string(yaml.safe_dump(d), origin="<test>")


# ------------------------------------------------------------------ module


def test_import_outside_repo_and_version(tmp_path):
    import subprocess

    code = "import polyload._core as c; print(c.__file__, c.version_number(), c.VERSION_NUMBER)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[0].endswith(".so")
    assert int(out[1]) == int(out[2]) == _core.VERSION_NUMBER
    assert _core.version_string() == _core.VERSION
    assert _core.err_name(_core.EMAGIC) == "EMAGIC"
    assert _core.strerror(_core.EMAGIC) == "bad magic number"
    assert _core.dtype_size("uint16") == 2 and _core.dtype_name(_core.DTYPE_FLOAT32) == "float32"


# ------------------------------------------------------------------ exceptions

MAPPING = {
    "EINVAL": polyload.PolyloadError, "ENOMEM": polyload.PolyloadError,
    "EIO": polyload.PolyloadIOError, "ENOENT": polyload.PolyloadIOError,
    "ECONFIG": polyload.ConfigError, "ETOPOLOGY": polyload.ConfigError,
    "ESTATE": polyload.StateError,
    "EMAGIC": polyload.FormatError, "EVERSION": polyload.FormatError,
    "EDTYPE": polyload.FormatError, "ECOUNT": polyload.FormatError,
    "EBOUNDS": polyload.FormatError, "ETRUNC": polyload.FormatError,
    "EDOCIDX": polyload.FormatError, "ERECORD": polyload.FormatError,
    "ERANGE": polyload.RangeError, "ECLOSED": polyload.PolyloadError,
}


@pytest.mark.parametrize("name", sorted(MAPPING))
def test_status_mapping(name):
    code = getattr(_core, name)
    with pytest.raises(polyload.PolyloadError) as ei:
        _core.raise_status(code, "the story")
    e = ei.value
    assert type(e) is MAPPING[name]
    assert (e.code, e.name, e.message) == (code, name, "the story")
    assert name in str(e) and "the story" in str(e)
    again = pickle.loads(pickle.dumps(e))  # exceptions cross processes
    assert type(again) is type(e) and again.code == code and again.message == e.message


def test_bad_path_is_io_error(tmp_path):
    missing = str(tmp_path / "nothing_here")
    with pytest.raises(polyload.PolyloadIOError) as ei:
        _core.Source.open("megatron", missing)
    e = ei.value
    assert e.name == "ENOENT" and e.code == _core.ENOENT
    assert isinstance(e, OSError) and e.errno == errno.ENOENT
    assert "nothing_here" in e.message


def test_missing_source_in_config(tmp_path, corpus):
    d = corpus.config()
    d["sources"][1]["path"] = str(tmp_path / "gone")
    with pytest.raises(polyload.PolyloadError) as ei:
        polyload.Loader(d, rank=0)
    assert isinstance(ei.value, (polyload.PolyloadIOError, polyload.ConfigError))
    assert "gone" in ei.value.message


def test_corrupt_idx_bad_magic(tmp_path, corpus):
    for ext in (".idx", ".bin"):
        shutil.copy(corpus.prefixes[0] + ext, str(tmp_path / ("bad" + ext)))
    with open(tmp_path / "bad.idx", "r+b") as f:
        f.write(b"NOTMAGIC")
    prefix = str(tmp_path / "bad")
    with pytest.raises(polyload.FormatError) as ei:
        _core.Source.open("megatron", prefix)
    e = ei.value
    assert (e.name, e.code) == ("EMAGIC", _core.EMAGIC)
    assert "bad.idx" in e.message
    # the same through the friendly Loader
    d = corpus.config()
    d["sources"][0]["path"] = prefix
    with pytest.raises(polyload.FormatError) as ei:
        polyload.Loader(d, rank=0)
    assert ei.value.name == "EMAGIC"


def test_bad_config_unknown_key(corpus):
    d = corpus.config(sequence_length=64)
    with pytest.raises(polyload.ConfigError) as ei:
        polyload.Loader(d, rank=0)
    e = ei.value
    assert (e.name, e.code) == ("ECONFIG", _core.ECONFIG)
    assert "sequence_length" in e.message
    cfg = core_config(corpus.config())
    with pytest.raises(polyload.ConfigError):
        cfg.set("no_such_key", 3)
    cfg.set("threads", 3)
    assert cfg.get_int("threads") == 3
    with pytest.raises(polyload.PolyloadError) as ei:  # C: EINVAL for an unknown key
        cfg.get_int("no_such_key")
    assert "no_such_key" in ei.value.message


def _first_batches(cfg, n=6):
    loader = _core.Loader.create(cfg, ranks=[0])
    try:
        return [np.asarray(loader.next(0).input_ids).tobytes() for _ in range(n)]
    finally:
        loader.close()


def test_config_shared_with_its_objects_copy_on_write(corpus):
    """A loader, planner or pipeline made from a Config shares its C config (no copy);
    a set() on the Config afterwards changes the Config only (it copies first), never
    the objects already made from it, whose batches stay those of the config they
    were made from."""
    ref = _first_batches(core_config(corpus.config()))
    heavy = _first_batches(core_config(corpus.config(
        sources=[dict(s, weight=w) for s, w in zip(corpus.config()["sources"], (0.05, 0.05, 0.9))])))
    assert heavy != ref
    cfg = core_config(corpus.config())
    fp = cfg.fingerprint()
    loader = _core.Loader.create(cfg, ranks=[0])
    planner = _core.Planner.create(cfg)
    chunks = lambda p: np.asarray(p.next()["chunks"]).tobytes()  # noqa: E731
    first = [chunks(planner) for _ in range(2)]
    pipe = _core.Pipeline.create(cfg, ranks=[0])
    cfg.set("sources.s0.weight", 0.05)  # while all three hold it
    cfg.set("sources.s1.weight", 0.05)
    cfg.set("sources.s2.weight", 0.9)
    assert cfg.fingerprint() != fp
    assert [np.asarray(loader.next(0).input_ids).tobytes() for _ in range(6)] == ref
    assert _first_batches(cfg) == heavy  # a new object sees the Config as changed
    again = _core.Planner.create(core_config(corpus.config()))
    assert [chunks(again) for _ in range(5)] == first + [chunks(planner) for _ in range(3)]
    loader.close()
    del loader, planner, pipe
    gc.collect()
    cfg.set("threads", 3)  # held by nobody now: changed in place
    assert cfg.get_int("threads") == 3 and _first_batches(cfg) == heavy


def test_changed_fingerprint_at_load_state_dict(corpus):
    with polyload.Loader(corpus.config(), rank=0) as a:
        next(a)
        state = a.state_dict()
    assert state["version"] == 1 and isinstance(state["blob"], bytes)
    with polyload.Loader(corpus.config(seq_length=128), rank=0) as b:
        with pytest.raises(polyload.StateError) as ei:
            b.load_state_dict(state)
        assert ei.value.name == "ESTATE" and "seq_length" in ei.value.message
        with pytest.raises(polyload.StateError):
            b.load_state_dict({"version": 1, "blob": state["blob"][:-3]})
        with pytest.raises(ValueError):
            b.load_state_dict({"version": 99, "blob": state["blob"]})


def test_state_pack_round_trip_and_corrupt_copies(corpus):
    with polyload.Loader(corpus.config(), rank=0) as a:
        for _ in range(3):
            next(a)
        blob = a.state_dict()["blob"]
    z = _core.state_pack(blob)
    assert z[:4] == b"PLSZ" and len(z) < len(blob)
    assert _core.state_unpack(z) == blob
    for bad in (z[:-2], z[:10], b"PLSX" + z[4:], z[:20] + bytes([z[20] ^ 0xFF]) + z[21:]):
        with pytest.raises(polyload.StateError):
            _core.state_unpack(bad)
    with pytest.raises(polyload.StateError):
        _core.state_pack(blob[:-1])


def test_rank_out_of_range(corpus):
    d = corpus.config()  # dp=2: world size 2
    with pytest.raises(polyload.RangeError) as ei:
        polyload.Loader(d, rank=2)
    assert isinstance(ei.value, IndexError)
    assert (ei.value.name, ei.value.code) == ("ERANGE", _core.ERANGE)
    loader = _core.Loader.create(core_config(d), ranks=[1])
    with pytest.raises(polyload.RangeError) as ei:
        loader.next(0)  # not served
    assert "rank 0" in ei.value.message
    loader.close()
    with pytest.raises(polyload.PolyloadError) as ei:
        loader.next(1)
    assert ei.value.name == "ECLOSED"


def test_source_read_errors(corpus):
    src = _core.Source.open("megatron", corpus.prefixes[0], name="zero")
    assert src.name == "zero" and src.type == "megatron" and src.token_dtype == "int32"
    assert len(src) == src.num_documents == len(corpus.lengths[0])
    with pytest.raises(polyload.RangeError):
        src.document_length(src.num_documents)
    with pytest.raises(polyload.RangeError):
        src.read(0, 0, int(corpus.lengths[0][0]) + 1)
    with pytest.raises(ValueError):
        src.read(0, dtype="float32")


def _idx_rss_kib(prefix):
    """Resident KiB of this process's mappings of ``prefix``.idx (smaps "Rss:")."""
    total, inside = None, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                inside = line.rstrip().endswith(prefix + ".idx")
                if inside and total is None:
                    total = 0
            elif inside and head == "Rss:":
                total += int(line.split()[1])
    return total


def test_source_release_pages(corpus):
    src = _core.Source.open("megatron", corpus.prefixes[0])
    n = len(src)
    want = [src.read(i).tolist() for i in range(n)]
    lengths = src.lengths(list(range(n)))
    assert _idx_rss_kib(corpus.prefixes[0]) > 0
    src.release_pages()
    assert _idx_rss_kib(corpus.prefixes[0]) == 0
    assert src.lengths(list(range(n))) == lengths
    assert [src.read(i).tolist() for i in range(n)] == want  # the same bytes, paged in again
    assert _idx_rss_kib(corpus.prefixes[0]) > 0
    assert src.release_pages() is None


def test_handles_not_picklable(corpus):
    cfg = core_config(corpus.config())
    with polyload.Loader(corpus.config(), rank=0) as loader:
        batch = loader._loader.next(0)
        for obj in (cfg, _core.Source.open("megatron", corpus.prefixes[0]), loader,
                    loader._loader, batch, batch.input_ids):
            with pytest.raises(TypeError):
                pickle.dumps(obj)


# ------------------------------------------------------------------ zero-copy


def test_zero_copy(corpus):
    loader = _core.Loader.create(core_config(corpus.config()), ranks=[0])
    b = loader.next(0)
    for name in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens"):
        arr = getattr(b, name)
        a1, a2 = np.asarray(arr), np.asarray(getattr(b, name))
        assert a1.ctypes.data == a2.ctypes.data == arr.address  # the C pointer, stable
        assert np.shares_memory(a1, a2)
        assert a1.nbytes == arr.nbytes and tuple(a1.shape) == arr.shape
    assert np.asarray(b.input_ids).dtype == np.int64
    assert np.asarray(b.loss_mask).dtype == np.float32
    assert np.asarray(b.cu_seqlens).dtype == np.int32
    assert np.asarray(b.input_ids).shape == (b.rows, b.cols) == (2, corpus.seq_length)
    assert isinstance(b.max_seqlen, int)
    # the friendly Loader hands out tensors over the same kind of memory
    with polyload.Loader(corpus.config(), rank=0) as fl:
        x = next(fl)
        assert x["input_ids"].dtype == torch.int64 and x["cu_seqlens"].dtype == torch.int32
        assert isinstance(x["max_seqlen"], int)
    loader.close()


def test_batch_memory_read_only(corpus, tmp_path):
    # Batch memory is shared by the served ranks of a DP group: exported read-only.
    loader = _core.Loader.create(core_config(corpus.config()), ranks=[0])
    b = loader.next(0)
    for name in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens"):
        arr = getattr(b, name)
        assert arr.readonly
        a = np.asarray(arr)
        assert not a.flags.writeable
        before = a.copy()
        with pytest.raises(ValueError):
            a[0] = 7
        with pytest.raises(ValueError):
            a.setflags(write=True)
        with pytest.raises((BufferError, TypeError), match="writable|read-only"):
            (ctypes.c_char * arr.nbytes).from_buffer(arr)  # a writable buffer request
        m = memoryview(arr)
        assert m.readonly
        with pytest.raises(TypeError):
            m[0] = 1
        np.testing.assert_array_equal(np.asarray(arr), before)
    d = b.to_dict((np.asarray,))
    assert set(d) == {"input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens",
                      "max_seqlen", "step_loss_tokens", "rank_loss_tokens",
                      "non_padding_tokens"}
    assert d["non_padding_tokens"] == b.tokens
    assert d["step_loss_tokens"] == b.step_loss_tokens >= d["rank_loss_tokens"] > 0
    assert all(not v.flags.writeable for k, v in d.items() if not isinstance(v, int))
    np.testing.assert_array_equal(d["input_ids"], np.asarray(b.input_ids))
    w = b.to_dict((np.asarray,), writable=True)
    assert w["input_ids"].flags.writeable
    assert w["input_ids"].ctypes.data == b.input_ids.address
    # Arrays that own their memory (reads) stay writable
    src = _core.Source.open("megatron", corpus.prefixes[0])
    r = np.asarray(src.read(0))
    r[0] = 5
    loader.close()


def test_loader_tensors_private_or_read_only(corpus):
    # One rank per DP group: writable zero-copy tensors, no torch warning.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with polyload.Loader(corpus.config(), rank=0) as fl:
            x = next(fl)
            assert x["input_ids"].dtype == torch.int64
            x["input_ids"] += 0  # allowed: no other rank receives this memory
    # Two TP peers of one DP group served by one loader share a build: each gets
    # a private copy, so an in-place change of one never reaches the other.
    cfg = corpus.config(topology={"dp": 2, "tp": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with polyload.Loader(cfg, rank=0, ranks=[0, 1]) as fl:
            a = fl.next_batch(0)
            b = fl.next_batch(1)
            assert torch.equal(a["input_ids"], b["input_ids"])
            assert a["input_ids"].data_ptr() != b["input_ids"].data_ptr()
            a["input_ids"].fill_(-1)
            assert not torch.equal(a["input_ids"], b["input_ids"])
    # Without torch's wrapping the dict holds read-only NumPy views.
    with polyload.Loader(cfg, rank=0, ranks=[0, 1]) as fl:
        fl._wrap = None
        fl._convert.clear()
        n = fl.next_batch(0)
        assert isinstance(n["input_ids"], np.ndarray) and not n["input_ids"].flags.writeable


def test_tensor_outlives_200_steps_and_loader(corpus):
    with polyload.Loader(corpus.config(train_steps=None, prefetch=2), rank=0) as loader:
        first = next(loader)
        kept = {k: v.clone() for k, v in first.items() if isinstance(v, torch.Tensor)}
        ptr = first["input_ids"].data_ptr()
        ptrs = set()
        for _ in range(200):
            b = next(loader)
            ptrs.add(b["input_ids"].data_ptr())
        assert ptr not in ptrs  # the kept buffer never went back to the pool
    for k, v in kept.items():  # even after close()
        assert torch.equal(first[k], v)


def test_dlpack_export_zero_copy_and_released(corpus):
    # to_dict(dlpack=torch.from_dlpack): one capsule per field, the C memory itself.
    loader = _core.Loader.create(core_config(corpus.config(train_steps=None)), ranks=[0],
                                 prefetch=1)
    b = loader.next(0)
    d = b.to_dict(None, writable=True, dlpack=torch.from_dlpack)
    ref = b.to_dict((np.asarray,))
    assert set(d) == set(ref)
    for name in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens"):
        t, a = d[name], ref[name]
        assert t.data_ptr() == getattr(b, name).address
        assert tuple(t.shape) == a.shape and t.is_contiguous()
        assert str(t.dtype) == "torch." + str(a.dtype)
        np.testing.assert_array_equal(t.numpy(), a)
    assert d["max_seqlen"] == ref["max_seqlen"]
    with pytest.raises(ValueError, match="writable"):
        b.to_dict(None, dlpack=torch.from_dlpack)
    with pytest.raises(ValueError, match="callable"):
        b.to_dict(None, writable=True, dlpack=3)
    kept = d["input_ids"].clone()
    del d, ref
    # Capsules nobody consumes give their reference back when dropped, and the
    # buffers of dropped tensors go back to the pool: a handful of addresses
    # over 120 micro-batches (a leak would give 120).
    addrs, tensors_addrs = set(), set()
    for i in range(120):
        b = loader.next(0)
        if i % 2:
            caps = b.to_dict(None, writable=True, dlpack=lambda c: c)
            assert type(caps["input_ids"]).__name__ == "PyCapsule"
            addrs.add(b.input_ids.address)
            del caps
        else:
            t = b.to_dict(None, writable=True, dlpack=torch.from_dlpack)
            tensors_addrs.add(t["input_ids"].data_ptr())
            del t
        del b
    assert len(addrs | tensors_addrs) <= 8, len(addrs | tensors_addrs)
    loader.close()
    assert kept.shape[0] == 2


def test_next_dict_equals_next_then_to_dict(corpus):
    # Loader.next_dict(rank, export) is next(rank) + Batch.to_dict(*export) in one
    # call: two loaders over one config give the same dicts, in every export mode,
    # to the end of the run, and then None.
    cfg = core_config(corpus.config(train_steps=3))
    a = _core.Loader.create(cfg, ranks=[0, 1], prefetch=1)
    b = _core.Loader.create(cfg, ranks=[0, 1], prefetch=1)
    exports = [(None, False, None), ((np.asarray,), False, None),
               ((np.asarray, torch.from_numpy), True, torch._C._from_dlpack),
               (None, True, torch.from_dlpack)]
    n = 0
    for i in range(100):
        rank, exp = i % 2, exports[(i // 2) % len(exports)]
        d = a.next_dict(rank, exp)
        batch = b.next(rank)
        if batch is None:
            assert d is None
            break
        ref = batch.to_dict(exp[0], writable=exp[1], dlpack=exp[2])
        assert set(d) == set(ref) >= {"input_ids", "labels", "loss_mask", "position_ids",
                                      "cu_seqlens", "max_seqlen"}
        for k, v in ref.items():
            if k == "max_seqlen":
                assert d[k] == v
                continue
            assert type(d[k]) is type(v)
            np.testing.assert_array_equal(np.asarray(d[k]), np.asarray(v))
        if exp[0] == (np.asarray,):  # read-only NumPy views of the C memory
            assert not d["input_ids"].flags.writeable
        if exp[2] is not None:  # zero-copy tensors, their memory their own build's
            assert d["input_ids"].data_ptr() != ref["input_ids"].data_ptr()
        n += 1
    assert n == 3 * 2 * 2  # train_steps x micro-batches per rank x ranks
    assert a.next_dict(0, exports[0]) is None
    with pytest.raises(polyload.RangeError):
        a.next_dict(5, exports[0])
    with pytest.raises(TypeError, match="3-tuple"):
        a.next_dict(0, (None, False))
    with pytest.raises(TypeError, match="3-tuple"):
        a.next_dict(0)
    a.close()
    b.close()
    with pytest.raises(polyload.PolyloadError):
        a.next_dict(0, exports[0])
    # Bad exports fail before a batch is taken: the next dict is the first one.
    c = _core.Loader.create(cfg, ranks=[0], prefetch=1)
    with pytest.raises(ValueError, match="writable"):
        c.next_dict(0, (None, False, torch.from_dlpack))
    with pytest.raises(TypeError, match="tuple of callables"):
        c.next_dict(0, ([np.asarray], False, None))
    first = c.next_dict(0, exports[1])
    d2 = _core.Loader.create(cfg, ranks=[0], prefetch=1)
    np.testing.assert_array_equal(first["input_ids"], d2.next(0).to_dict((np.asarray,))["input_ids"])
    c.close()
    d2.close()


def test_batch_release_keeps_arrays(corpus):
    loader = _core.Loader.create(core_config(corpus.config()), ranks=[0], prefetch=1)
    b = loader.next(0)
    ids = b.input_ids
    want = np.array(ids)  # a copy
    b.release()
    assert b.released
    with pytest.raises(ValueError):
        b.input_ids
    for _ in range(20):
        loader.next(0)
    loader.close()
    del loader
    gc.collect()
    assert np.array_equal(np.asarray(ids), want)


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_no_leak_10000_batches(corpus):
    # 4 x 1024 tokens: ~110 KiB of arrays per batch, ~1 GiB if every batch leaked.
    d = corpus.config(seq_length=1024, micro_batch_size=4, global_batch_size=8,
                      train_steps=None, topology={"dp": 2}, threads=2, prefetch=4)
    bound = 64 << 20
    with polyload.Loader(d, rank=0) as loader:
        for _ in range(500):
            b = next(loader)
            np.asarray(b["input_ids"]).sum()
        gc.collect()
        before = _rss_bytes()
        for _ in range(10_000):
            b = next(loader)
            b["input_ids"][0, 0].item()
        del b
        gc.collect()
        grown = _rss_bytes() - before
    assert grown < bound, f"RSS grew by {grown >> 20} MiB over 10,000 batches"


# ------------------------------------------------------------------ the GIL


def test_next_releases_the_gil(corpus):
    """While next() blocks in C, another Python thread runs.

    With a long switch interval, the busy thread can only run while the main thread
    has released the GIL; a count that moves across next() proves it was released.
    """
    d = corpus.config(seq_length=32768, micro_batch_size=8, global_batch_size=16,
                      topology={"dp": 2}, threads=1, prefetch=1, train_steps=2)
    loader = _core.Loader.create(core_config(d), ranks=[0])
    count = [0]
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            count[0] += 1

    old = sys.getswitchinterval()
    t = threading.Thread(target=busy)
    t.start()
    try:
        sys.setswitchinterval(0.5)
        moved = 0
        for _ in range(2):
            before = count[0]
            b = loader.next(0)
            moved += count[0] - before
            assert b is not None
    finally:
        sys.setswitchinterval(old)
        stop.set()
        t.join()
        loader.close()
    assert moved > 0


def test_concurrent_ranks_from_threads(corpus):
    d = corpus.config(train_steps=6)
    loader = _core.Loader.create(core_config(d), ranks=[0, 1])
    got = {0: [], 1: []}

    def run(r):
        while (b := loader.next(r)) is not None:
            got[r].append(np.asarray(b.input_ids).copy())

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loader.close()
    ref = _core.Loader.create(core_config(d), ranks=[0, 1], threads=1)
    for r in (0, 1):
        assert len(got[r]) == 6 * 2
    for k in range(12):
        for r in (0, 1):
            assert np.array_equal(np.asarray(ref.next(r).input_ids), got[r][k])
    ref.close()


# ------------------------------------------------------------------ fork


def test_forked_child_does_not_break_parent(corpus):
    d = corpus.config(train_steps=8)
    with polyload.Loader(d, rank=0) as ref:
        want = [b["input_ids"].clone() for b in ref]
    loader = polyload.Loader(d, rank=0)
    got = [next(loader)["input_ids"].clone() for _ in range(3)]
    held = next(loader)  # a batch alive across the fork
    got.append(held["input_ids"].clone())
    pid = os.fork()
    if pid == 0:  # child: must not free (or use) the parent's C state
        code = 0
        try:
            try:
                loader._loader.next(0)
                code = 3
            except RuntimeError:
                pass
            del held
            loader.close()
            del loader
            gc.collect()
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    got += [b["input_ids"].clone() for b in loader]
    loader.close()
    assert torch.equal(held["input_ids"], want[3])
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ misc


def test_pin_memory_without_cuda_warns_once(corpus):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: pin_memory is honoured")
    with pytest.warns(RuntimeWarning, match="pin_memory") as rec:
        loader = polyload.Loader(corpus.config(train_steps=2), rank=0, pin_memory=True)
        batches = list(loader)
    assert len([w for w in rec if "pin_memory" in str(w.message)]) == 1
    assert len(batches) == 2 * 2 and not batches[0]["input_ids"].is_pinned()
    loader.close()


def test_numpy_without_torch(corpus, monkeypatch):
    monkeypatch.setattr(polyload.loader, "_import_torch", lambda: None)
    with polyload.Loader(corpus.config(train_steps=1), rank=1) as loader:
        b = next(loader)
    assert isinstance(b["input_ids"], np.ndarray) and b["input_ids"].dtype == np.int64
    assert isinstance(b["cu_seqlens"], np.ndarray) and b["cu_seqlens"].dtype == np.int32


def test_config_accessors(corpus):
    cfg = core_config(corpus.config(topology={"dp": 2, "tp": 2, "pp": 2}))
    assert cfg.world_size() == 8
    assert cfg.num_sources == 3 and [s["name"] for s in cfg.sources] == ["s0", "s1", "s2"]
    assert cfg.source_path(1) == corpus.prefixes[1]
    assert abs(sum(cfg.source_weight(i) for i in range(3)) - 1) < 1e-9
    info = cfg.rank_info(1)
    assert info["tp_rank"] == 1 and info["dp_rank"] == 0 and info["pp_rank"] == 0
    with pytest.raises(polyload.RangeError):
        cfg.rank_info(8)
    with pytest.raises(polyload.RangeError):
        cfg.source_name(3)


def test_cost_model(corpus):
    cfg = core_config(corpus.config(cost={"preset": "linear"}))
    assert cfg.cost_sequence([3, 4]) == pytest.approx(7.0)
    cfg = core_config(corpus.config(cost={"preset": "causal"}))
    assert cfg.cost_sequence([3, 4]) == pytest.approx(25.0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(100, 1000, 20).astype(float)
    sq = rng.integers(1000, 100000, 20).astype(float)
    fit = _core.cost_fit(tokens, sq, 2 * tokens + 0.5 * sq + 7)
    assert fit["a"] == pytest.approx(2) and fit["b"] == pytest.approx(0.5)
    assert fit["c"] == pytest.approx(7) and fit["r2"] == pytest.approx(1)
    with pytest.raises(polyload.PolyloadError) as ei:
        _core.cost_fit([1.0], [1.0], [1.0])
    assert ei.value.name == "EINVAL"
