"""Raw text and image-text sources in object storage: JSON Lines (plain and
compressed), text, Parquet and WebDataset sources read from a real
S3-compatible server (moto_server, through the fault-injecting proxy) give the
batches that the same files on disk give, in the embedded loader, across a
resume with an empty cache and in a Ray deployment; faults are retried; a chunk
evicted from a small cache is fetched again, never read as zeros; a read that
cannot be fetched names the object, the record and its offset."""

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

import polyload
from polyload import _core
from conftest import batch_hash
from s3_fixtures import batch_hashes, quiet_loader, s3env, s3_environ  # noqa: F401

import fortunes_corpus as fc

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUCKET = "pl-text"
IMG = 300  # the webdataset sources' image token (caption bytes are 0..255)


_loader = quiet_loader
_hashes = batch_hashes


def _all_ranks(cfg):
    return [h for r in range(cfg["topology"]["dp"]) for h in _hashes(cfg, rank=r)]


def _texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


@pytest.fixture(scope="module")
def corpus(s3env, tmp_path_factory):
    """The fortunes corpus as JSONL (plain, .gz, .zst), text files and Parquet, on disk
    under c["dir"]/<kind>/ and in the bucket under <kind>/."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = fc.build(tmp_path_factory.mktemp("fortunes"))
    root = tmp_path_factory.mktemp("rtext")
    c = dict(base, dir=str(root))
    texts = {n: _texts(os.path.join(base["dir"], f"{n}.jsonl")) for n in ("tech", "wit")}
    for kind in ("jsonl", "gz", "zst", "text", "parquet"):
        os.makedirs(root / kind)
    for n in ("tech", "wit"):
        body = open(os.path.join(base["dir"], f"{n}.jsonl"), "rb").read()
        (root / "jsonl" / f"{n}.jsonl").write_bytes(body)
        (root / "gz" / f"{n}.jsonl.gz").write_bytes(gzip.compress(body))
        (root / "zst" / f"{n}.jsonl.zst").write_bytes(pa.compress(body, "zstd", asbytes=True))
    for i, t in enumerate(texts["tech"][:120]):  # a record per file
        (root / "text" / f"doc{i:04d}.txt").write_text(t, encoding="utf-8")
    # tech: row groups of 100 rows after another column; wit: two files, one zstd
    pq.write_table(pa.table({"id": np.arange(len(texts["tech"])), "text": texts["tech"]}),
                   str(root / "parquet" / "tech.parquet"), row_group_size=100)
    os.makedirs(root / "parquet" / "wit")
    pq.write_table(pa.table({"text": texts["wit"][:250]}),
                   str(root / "parquet" / "wit" / "a.parquet"), row_group_size=64)
    pq.write_table(pa.table({"text": texts["wit"][250:]}),
                   str(root / "parquet" / "wit" / "b.parquet"), row_group_size=1000,
                   compression="zstd")
    s3env.put_tree(BUCKET, "", str(root))
    return c


def _cfg(c, sources, **kw):
    cfg = fc.config(c, **dict({"tokenizer": {"type": "hf", "path": c["tokenizer"]},
                               "train_steps": 6}, **kw))
    cfg["sources"] = sources
    return cfg


def _local(c, rel):
    return os.path.join(c["dir"], rel)


def _remote(rel):
    return f"s3://{BUCKET}/{rel}"


def _pair(c, make, cache, **kw):
    """The config over the files on disk and over the bucket; make(where) gives the
    sources with where(rel) as each path."""
    local = _cfg(c, make(lambda rel: _local(c, rel)), **kw)
    remote = _cfg(c, make(_remote), **kw)
    remote["cache"] = {"dir": str(cache), "max_bytes": 1 << 30, "chunk_bytes": 4096}
    return local, remote


def _jsonl(where):
    return [{"name": "tech", "type": "jsonl", "path": where("jsonl/tech.jsonl"), "weight": 0.6},
            {"name": "wit", "type": "jsonl", "path": where("jsonl/wi*.jsonl"), "weight": 0.4}]


def test_jsonl_batches_equal_local(corpus, s3_environ, s3env, tmp_path):
    local, remote = _pair(corpus, _jsonl, tmp_path / "c")
    want = _all_ranks(local)
    assert len(want) == 6 * 2 * 2  # dp 2, 2 micro-batches per rank
    s3env.faults(reset=True)
    assert _all_ranks(remote) == want
    st = s3env.stats()
    size = sum(os.path.getsize(_local(corpus, f"jsonl/{n}.jsonl")) for n in ("tech", "wit"))
    # Each object scanned once at open, then read from the cache: no more bytes than
    # the objects hold per run (two ranks, one cache), and no sidecar written.
    assert st["GET"] > 0 and st["bytes"] <= size + 4096 * 4
    assert st["PUT"] == 0
    # A directory lists the bucket as a glob does.
    _, remote = _pair(corpus, lambda w: [{"name": "all", "type": "jsonl",
                                          "path": w("jsonl/"), "weight": 1}], tmp_path / "c")
    local = _cfg(corpus, [{"name": "all", "type": "jsonl",
                           "path": _local(corpus, "jsonl/*.jsonl"), "weight": 1}])
    assert _hashes(remote) == _hashes(local)


@pytest.mark.parametrize("ext", ["gz", "zst"])
def test_compressed_jsonl_read_whole_through_the_cache(ext, corpus, s3_environ, s3env,
                                                       tmp_path):
    def make(where):
        return [{"name": n, "type": "jsonl", "path": where(f"{ext}/{n}.jsonl.{ext}"),
                 "weight": w} for n, w in (("tech", 0.6), ("wit", 0.4))]

    local, remote = _pair(corpus, make, tmp_path / "c")
    assert _hashes(remote) == _hashes(local)
    # Compressed bytes: the same batches as the plain files.
    plain, _ = _pair(corpus, lambda w: [dict(s, path=w(s["path"].replace(f"{ext}/", "jsonl/")
                                                      .replace(f".{ext}", "")))
                                        for s in make(lambda r: r)], tmp_path / "c")
    assert _hashes(plain) == _hashes(local)


def test_text_batches_equal_local(corpus, s3_environ, tmp_path):
    def make(where):
        return [{"name": "docs", "type": "text", "path": where("text/"), "weight": 0.5},
                {"name": "wit", "type": "jsonl", "path": where("jsonl/wit.jsonl"),
                 "weight": 0.5}]

    local, remote = _pair(corpus, make, tmp_path / "c")
    assert _all_ranks(remote) == _all_ranks(local)


def test_parquet_reads_footer_and_row_groups(corpus, s3_environ, s3env, tmp_path):
    pytest.importorskip("pyarrow")

    def make(where):
        return [{"name": "tech", "type": "parquet", "path": where("parquet/tech.parquet"),
                 "weight": 0.6},
                {"name": "wit", "type": "parquet", "path": where("parquet/wit/"),
                 "weight": 0.4}]

    local, remote = _pair(corpus, make, tmp_path / "c")
    want = _hashes(local)
    s3env.faults(reset=True)
    assert _hashes(remote) == want
    st = s3env.stats()
    # Footers and the text column's chunks: fewer bytes than the objects (tech.parquet
    # holds an id column that is never fetched but for the chunks it shares).
    size = sum(os.path.getsize(os.path.join(d, f))
               for d, _, fs in os.walk(_local(corpus, "parquet")) for f in fs)
    assert 0 < st["bytes"] < size
    # The same batches as the JSON Lines of the same text.
    jl, _ = _pair(corpus, lambda w: [{"name": "tech", "type": "jsonl",
                                      "path": w("jsonl/tech.jsonl"), "weight": 0.6},
                                     {"name": "wit", "type": "jsonl",
                                      "path": w("jsonl/wit.jsonl"), "weight": 0.4}],
                  tmp_path / "c")
    assert _hashes(jl) == want


def test_resume_with_an_empty_cache(corpus, s3_environ, tmp_path):
    def make(where):
        return [{"name": "tech", "type": "parquet", "path": where("parquet/tech.parquet"),
                 "weight": 0.5},
                {"name": "wit", "type": "jsonl", "path": where("jsonl/wit.jsonl"),
                 "weight": 0.5}]

    local, remote = _pair(corpus, make, tmp_path / "a", train_steps=8)
    full = _hashes(local)
    with _loader(remote, rank=0) as ld:
        for _ in range(5):
            next(ld)
        state = ld.state_dict()
    # Resumed in another process's place with another, empty cache: the rest of the
    # batches that the files on disk give.
    remote["cache"]["dir"] = str(tmp_path / "b")
    assert _hashes(remote, state=state) == full[5:]


def test_faults_during_a_run_give_the_same_batches(corpus, s3_environ, s3env, tmp_path):
    local, _ = _pair(corpus, _jsonl, tmp_path / "x")
    want = _hashes(local)
    # A run lists two paths and fetches two objects (the scans at open): every second
    # or third GET spoiled.
    for i, (kind, every) in enumerate((("http503", 2), ("cut", 3), ("truncate", 2))):
        _, remote = _pair(corpus, _jsonl, tmp_path / f"c{i}")
        s3env.faults(reset=True, every=every, kind=kind)
        assert _hashes(remote) == want, kind
        assert s3env.stats()["injected"] > 0, kind


def test_exhausted_retries_name_object_record_and_offset(corpus, s3_environ, s3env,
                                                         tmp_path, monkeypatch):
    monkeypatch.setenv("POLYLOAD_REMOTE_ATTEMPTS", "2")
    monkeypatch.setenv("POLYLOAD_CACHE_GRACE_S", "1")
    _, remote = _pair(corpus, _jsonl, tmp_path / "c")
    remote["cache"]["max_bytes"] = 8192  # two chunks: the scan's chunks leave again
    src = fc.open_source(remote, 0)  # the object listed, scanned, its spans kept
    time.sleep(2.1)  # past the grace of the chunks the scan used
    # Another object through the same cache evicts what the scan left.
    other = _pair(corpus, lambda w: [dict(s, path=w("jsonl/wit.jsonl")) for s in _jsonl(w)],
                  tmp_path / "c")[1]
    other["cache"]["max_bytes"] = 8192
    fc.open_source(other, 0)
    s3env.faults(http503=1000)
    with pytest.raises(polyload.PolyloadError) as e:
        src.read(3)
    msg = str(e.value)
    assert f"s3://{BUCKET}/jsonl/tech.jsonl: record 3 (byte offset " in msg
    assert "failed after 2 attempts; last: HTTP 503" in msg


def test_evicted_chunks_are_fetched_again(corpus, s3_environ, s3env, tmp_path, monkeypatch):
    """A cache of a few chunks: what the scan at open fetched is evicted (by another
    object read through the same cache) before the records are read; each read fetches
    its bytes again and gives the tokens and batches of the file on disk."""
    # A used chunk stays at least a second: a read that made its bytes present copies
    # them before they can leave, however the threads run.
    monkeypatch.setenv("POLYLOAD_CACHE_GRACE_S", "2")
    tech = _remote("jsonl/tech.jsonl")

    def tiny(cfg):
        cfg["cache"]["max_bytes"] = 4 * 4096
        return cfg

    local, remote = _pair(corpus, _jsonl, tmp_path / "c")
    tiny(remote)

    def evict(rel):
        # Another object read through the same cache (fetched for the first time, so
        # that the bound is passed) evicts what no read used in the last 2 s.
        other = tiny(_pair(corpus, lambda w: [{"name": "o", "type": "jsonl", "path": w(rel)}],
                           tmp_path / "c")[1])
        fc.open_source(other, 0)

    lsrc, rsrc = fc.open_source(local, 0), fc.open_source(remote, 0)
    time.sleep(3.1)  # past the grace of the chunks the scan used
    evict("gz/wit.jsonl.gz")
    s3env.faults(reset=True)
    for d in range(0, len(lsrc), 7):
        assert np.asarray(rsrc.read(d)).tolist() == np.asarray(lsrc.read(d)).tolist(), d
    assert s3env.stats()["paths"].get(f"/{BUCKET}/jsonl/tech.jsonl", 0) > 3
    del rsrc
    # The loader on the same small cache: the batches of the files on disk (enough
    # steps that most documents are read after the eviction).
    local["train_steps"] = remote["train_steps"] = 30
    with _loader(remote, rank=0) as ld:
        time.sleep(3.1)
        evict("zst/wit.jsonl.zst")
        s3env.faults(reset=True)
        got = [batch_hash(b) for b in ld]
    assert got == _hashes(local)
    assert s3env.stats()["paths"].get(f"/{BUCKET}/jsonl/tech.jsonl", 0) > 0, tech


def test_ray_deployment_reads_remote_jsonl(corpus, s3_environ, tmp_path):
    """Source loaders of a Ray deployment open the remote JSONL objects themselves,
    through their node's cache: the batches of the embedded loader on the files on disk."""
    pytest.importorskip("ray")
    local, remote = _pair(corpus, _jsonl, tmp_path / "node-cache", train_steps=4)
    want = {str(r): _hashes(local, rank=r) for r in (0, 1)}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(remote))
    out = tmp_path / "out.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "remote", "ray_run.py"),
                        str(path), "2", str(out)], env=s3_environ, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(out.read_text()) == want
    assert any(f.endswith(".data") for f in os.listdir(tmp_path / "node-cache" / "o"))


# ------------------------------------------------------------------ webdataset


@pytest.fixture(scope="module")
def shards(s3env, tmp_path_factory):
    spec = importlib.util.spec_from_file_location(
        "make_vlm_corpus", os.path.join(ROOT, "scripts", "make_vlm_corpus.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("vlm")
    mod.write_shards(mod.samples(), str(out), 8)
    s3env.put_tree(BUCKET, "wds", str(out))
    return out


def _wds_cfg(path, cache=None):
    cfg = {"seed": 3, "seq_length": 2048, "global_batch_size": 4, "micro_batch_size": 2,
           "train_steps": 3, "topology": {"dp": 1}, "threads": 2,
           "sources": [{"name": "img", "type": "webdataset", "path": path, "index": "memory",
                        "image": {"mode": "native", "token_id": IMG,
                                  "max_pixels": 200704}}]}
    if cache:
        cfg["cache"] = {"dir": str(cache), "chunk_bytes": 65536}
    return cfg


def test_webdataset_batches_equal_local(shards, s3_environ, s3env, tmp_path):
    want = _hashes(_wds_cfg(str(shards / "shard-{000000..000003}.tar")))
    assert len(want) == 6
    for i, path in enumerate(("shard-{000000..000003}.tar", "shard-*.tar", "")):
        s3env.faults(reset=True)
        assert _hashes(_wds_cfg(_remote("wds/" + path), tmp_path / f"c{i}")) == want, path
        st = s3env.stats()
        assert st["PUT"] == 0  # no .plwds sidecar written into the bucket
    # The images read by the source as on disk; a fault on the way is retried.
    s3env.faults(reset=True, every=3, kind="cut")
    rsrc = _core.Source.open_webdataset(_remote("wds/shard-*.tar"), IMG, mode="fixed")
    lsrc = _core.Source.open_webdataset(str(shards / "shard-*.tar"), IMG, mode="fixed")
    assert len(rsrc) == len(lsrc) == 26
    for k in range(len(lsrc)):
        assert np.array_equal(np.asarray(rsrc.read_image(k)), np.asarray(lsrc.read_image(k)))
        assert np.asarray(rsrc.read(k)).tolist() == np.asarray(lsrc.read(k)).tolist()
    assert s3env.stats()["injected"] > 0


def test_webdataset_missing_shard_names_it(shards, s3_environ, tmp_path):
    with pytest.raises(polyload.PolyloadError) as e:
        _hashes(_wds_cfg(_remote("wds/shard-{000000..000009}.tar"), tmp_path / "c"))
    assert f"s3://{BUCKET}/wds/shard-000004.tar" in str(e.value)


def test_every_type_through_a_small_cache_under_faults(corpus, shards, s3_environ, s3env,
                                                       tmp_path, monkeypatch):
    """Four types in one run through a cache of 16 chunks with a grace of 1 s (chunks
    leave about as soon as a read has used them, images are larger than the cache),
    connections cut: the batches of the files on disk."""
    monkeypatch.setenv("POLYLOAD_CACHE_GRACE_S", "1")

    def make(where, wds):
        return [{"name": "j", "type": "jsonl", "path": where("jsonl/wit.jsonl"), "weight": 0.3},
                {"name": "g", "type": "jsonl", "path": where("gz/tech.jsonl.gz"), "weight": 0.1},
                {"name": "p", "type": "parquet", "path": where("parquet/tech.parquet"),
                 "weight": 0.2},
                {"name": "t", "type": "text", "path": where("text/"), "weight": 0.1},
                {"name": "w", "type": "webdataset", "weight": 0.3, "index": "memory",
                 "path": wds("shard-{000000..000003}.tar"),
                 "image": {"mode": "fixed", "token_id": IMG}}]

    kw = {"seq_length": 2048, "train_steps": 5, "topology": {"dp": 1}, "threads": 2}
    local = _cfg(corpus, make(lambda r: _local(corpus, r), lambda r: str(shards / r)), **kw)
    remote = _cfg(corpus, make(_remote, lambda r: _remote("wds/" + r)), **kw)
    remote["cache"] = {"dir": str(tmp_path / "c"), "max_bytes": 16 * 4096, "chunk_bytes": 4096}
    want = _hashes(local)
    s3env.faults(reset=True, every=4, kind="cut")
    assert _hashes(remote) == want
    assert s3env.stats()["injected"] > 0
