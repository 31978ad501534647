"""Sources in object storage: Megatron, llm.c and flat sources read from a real
S3-compatible server (moto_server, through the fault-injecting proxy) give the
batches that the same files on disk give; globs and directories list the
bucket; the cache is shared and bounded; faults are retried; a resume does not
depend on the cache."""

import os

import numpy as np
import pytest
import yaml

import polyload
from polyload import _core
from conftest import Corpus
from s3_fixtures import batch_hashes, quiet_loader, s3env, s3_environ  # noqa: F401

pytest.importorskip("torch")

BUCKET = "pl-sources"


_loader = quiet_loader
_hashes = batch_hashes


@pytest.fixture(scope="module")
def remote_corpus(s3env, tmp_path_factory):
    c = Corpus(tmp_path_factory.mktemp("rcorpus"))
    s3env.put_tree(BUCKET, "mega", c.dir)
    return c


def _remote_cfg(c, cache, **kw):
    cfg = c.config(**kw)
    for s in cfg["sources"]:
        s["path"] = f"s3://{BUCKET}/mega/" + os.path.basename(s["path"])
    cfg["cache"] = {"dir": str(cache), "max_bytes": 1 << 30, "chunk_bytes": 4096}
    return cfg


def test_megatron_batches_equal_local(remote_corpus, s3_environ, s3env, tmp_path,
                                     monkeypatch):
    local = _hashes(remote_corpus.config(train_steps=8))
    remote = _hashes(_remote_cfg(remote_corpus, tmp_path / "c", train_steps=8))
    assert remote == local and len(local) == 8 * 2  # dp 2, 2 micro-batches per rank
    st = s3env.stats()
    # Sizes and ETags come from the listing (one per source path): no HEAD.
    k = st["kinds"]
    assert k["LIST"]["n"] == 3 and k["GET .idx"]["n"] == 3 and k["GET .bin"]["n"] > 0
    assert st["HEAD"] == 0
    # A second run with the warm cache: a LIST per source path, nothing else.
    s3env.faults(reset=True)
    assert _hashes(_remote_cfg(remote_corpus, tmp_path / "c", train_steps=8)) == local
    st = s3env.stats()
    assert st["GET"] == 3 and set(st["kinds"]) == {"LIST"} and st["HEAD"] == 0
    assert set(st["paths"]) == {f"/{BUCKET}/"}
    # With the listing's ETags not trusted, a HEAD per object instead.
    s3env.faults(reset=True)
    monkeypatch.setenv("POLYLOAD_REMOTE_LIST_ETAG", "0")
    assert _hashes(_remote_cfg(remote_corpus, tmp_path / "c", train_steps=8)) == local
    st = s3env.stats()
    assert st["HEAD"] == 6 and set(st["kinds"]) == {"LIST", "HEAD .idx", "HEAD .bin"}


def test_parsing_touches_nothing(remote_corpus, s3_environ, tmp_path):
    cfg = _remote_cfg(remote_corpus, tmp_path / "c")
    cfg["sources"][0]["path"] = "s3://no-such-bucket-anywhere/x"
    # Parsing and validating the config makes no request...
    _core.Config.parse_string(yaml.safe_dump(cfg))
    # ...opening the source does, and names it.
    with pytest.raises(polyload.PolyloadError) as e:
        _loader(cfg, rank=0)
    assert "s3://no-such-bucket-anywhere/x" in str(e.value)
    assert "testing-secret" not in str(e.value)


def test_glob_and_directory(remote_corpus, s3_environ, tmp_path):
    local = remote_corpus.config(train_steps=4)
    local["sources"] = [{"name": "all", "type": "megatron", "path": remote_corpus.dir,
                         "weight": 1}]
    want = _hashes(local)
    for path in (f"s3://{BUCKET}/mega/", f"s3://{BUCKET}/mega", f"s3://{BUCKET}/mega/src*"):
        cfg = _remote_cfg(remote_corpus, tmp_path / "c", train_steps=4)
        cfg["sources"] = [{"name": "all", "type": "megatron", "path": path, "weight": 1}]
        assert _hashes(cfg) == want, path


def test_faults_during_a_run_give_the_same_batches(remote_corpus, s3_environ, s3env, tmp_path):
    local = _hashes(remote_corpus.config(train_steps=6))
    s3env.faults(every=3, kind="http503")
    assert _hashes(_remote_cfg(remote_corpus, tmp_path / "a", train_steps=6)) == local
    s3env.faults(reset=True, every=4, kind="cut")
    assert _hashes(_remote_cfg(remote_corpus, tmp_path / "b", train_steps=6)) == local
    s3env.faults(reset=True, every=5, kind="truncate")
    assert _hashes(_remote_cfg(remote_corpus, tmp_path / "c", train_steps=6)) == local


def test_exhausted_retries_name_object_and_range(remote_corpus, s3_environ, s3env, tmp_path,
                                                 monkeypatch):
    monkeypatch.setenv("POLYLOAD_REMOTE_ATTEMPTS", "2")
    cfg = _remote_cfg(remote_corpus, tmp_path / "c", train_steps=6)
    with _loader(cfg, rank=0) as ld:  # open: HEADs and the .idx files
        s3env.faults(http503=1000)
        with pytest.raises(polyload.PolyloadError) as e:
            for _ in ld:
                pass
    msg = str(e.value)
    assert f"s3://{BUCKET}/mega/src" in msg and ".bin: bytes [" in msg
    assert "failed after 2 attempts; last: HTTP 503" in msg


def test_resume_does_not_depend_on_the_cache(remote_corpus, s3_environ, tmp_path):
    full = _hashes(remote_corpus.config(train_steps=8))
    with _loader(_remote_cfg(remote_corpus, tmp_path / "a", train_steps=8), rank=0) as ld:
        for _ in range(5):
            next(ld)
        state = ld.state_dict()
    # Resumed in another process with another, empty cache: the same batches.
    rest = _hashes(_remote_cfg(remote_corpus, tmp_path / "b", train_steps=8), state=state)
    assert rest == full[5:]


def test_dataset_replaced_between_runs_gives_the_new_batches(s3env, s3_environ, tmp_path):
    """The cache is warm with a dataset; the dataset is then replaced in the
    bucket (.bin and .idx): the next run's listing gives new ETags, so the new
    files are fetched and the batches are those of the new files on disk."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = Corpus(tmp_path / "a", seed=7), Corpus(tmp_path / "b", seed=8)

    def remote(c):
        cfg = c.config(train_steps=4)
        for s in cfg["sources"]:
            s["path"] = f"s3://{BUCKET}/repl/" + os.path.basename(s["path"])
        cfg["cache"] = {"dir": str(tmp_path / "cache"), "max_bytes": 1 << 30,
                        "chunk_bytes": 4096}
        return cfg

    s3env.put_tree(BUCKET, "repl", a.dir)
    assert _hashes(remote(a)) == _hashes(a.config(train_steps=4))
    s3env.faults(reset=True)
    assert _hashes(remote(a)) == _hashes(a.config(train_steps=4))
    assert set(s3env.stats()["kinds"]) == {"LIST"}  # warm: nothing but the listings
    s3env.put_tree(BUCKET, "repl", b.dir)
    s3env.faults(reset=True)
    new = _hashes(remote(b))
    assert new == _hashes(b.config(train_steps=4)) != _hashes(a.config(train_steps=4))
    k = s3env.stats()["kinds"]
    assert k["GET .idx"]["n"] == 3 and "HEAD .idx" not in k


def _write_tokens(path, tokens, dtype, llmc):
    if llmc:
        header = np.zeros(256, dtype=np.int32)
        header[0] = 20240520 if dtype == np.uint16 else 20240801
        header[1] = 1
        header[2] = len(tokens)
        with open(path, "wb") as f:
            f.write(header.tobytes())
            f.write(np.asarray(tokens, dtype=dtype).tobytes())
    else:
        np.asarray(tokens, dtype=dtype).tofile(path)


@pytest.mark.parametrize("kind", ["llmc", "flat"])
def test_token_shards_equal_local(kind, s3env, s3_environ, tmp_path):
    rng = np.random.default_rng(3)
    d = tmp_path / "shards"
    d.mkdir()
    eos = 50256 if kind == "llmc" else 0
    for i in range(3):
        toks = []
        for _ in range(40):
            body = list(rng.integers(1, 50000, size=int(rng.integers(3, 90))))
            toks += [eos] + body if kind == "llmc" else body + [eos]
        _write_tokens(d / f"part{i}.bin", toks, np.uint16, kind == "llmc")
    s3env.put_tree(BUCKET, f"tok-{kind}", str(d))
    base = {"seed": 5, "seq_length": 64, "global_batch_size": 4, "micro_batch_size": 2,
            "train_steps": 5, "topology": {"dp": 1}, "threads": 2,
            "sidecar_index": "memory"}
    local = dict(base, sources=[{"name": "t", "type": kind, "path": str(d / "*.bin")}])
    remote = dict(base, sources=[{"name": "t", "type": kind,
                                  "path": f"s3://{BUCKET}/tok-{kind}/*.bin"}],
                  cache={"dir": str(tmp_path / "cache"), "chunk_bytes": 4096})
    assert _hashes(remote) == _hashes(local)


def test_source_loader_reads_equal_local(remote_corpus, s3_environ, s3env, tmp_path):
    """The path of the distributed deployment's source loaders: read_many and the
    reply (read_rows_reply) of a plan's reads, from remote sources with a cold cache,
    equal those from disk; the reads of one call are requested together."""
    local = _core.Config.parse_string(yaml.safe_dump(remote_corpus.config(train_steps=3)))
    remote = _core.Config.parse_string(
        yaml.safe_dump(_remote_cfg(remote_corpus, tmp_path / "c", train_steps=3)))
    planner = _core.Planner.create(local)
    plan = _core.Plan.decode(planner.next_plan().encode())
    reads = np.concatenate([np.asarray(plan.reads(r, mb)) for r in (0, 1)
                            for mb in range(plan.micro_batches_per_rank)])
    ls = [local.open_source(i) for i in range(3)]
    s3env.faults(reset=True)
    rs = [remote.open_source(i) for i in range(3)]
    opened = s3env.stats()["GET"]
    for s in range(3):
        mine = reads[reads[:, 0] == s]
        assert np.asarray(rs[s].read_many(mine)).tolist() == \
            np.asarray(ls[s].read_many(mine)).tolist()
    assert _core.read_rows_reply(rs, reads) == _core.read_rows_reply(ls, reads)
    # One read_many: its ranges in at most a few requests (chunks merged), not one each.
    assert s3env.stats()["GET"] - opened <= 3 * 4


def test_ray_deployment_reads_remote_sources(remote_corpus, s3_environ, tmp_path):
    """Source loaders of a Ray deployment open the remote sources themselves, through
    their node's cache, and the batches equal the embedded loader's on the files on disk."""
    pytest.importorskip("ray")
    import json
    import subprocess
    import sys

    cfg = _remote_cfg(remote_corpus, tmp_path / "node-cache", train_steps=5,
                      topology={"dp": 2})
    want = {str(r): _hashes(remote_corpus.config(train_steps=5, topology={"dp": 2}), rank=r)
            for r in (0, 1)}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out.json"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, os.path.join(root, "tests", "remote", "ray_run.py"),
                        str(path), "2", str(out)], env=s3_environ, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(out.read_text()) == want
    # The node cache holds the objects the source loaders read.
    assert any(f.endswith(".data") for f in os.listdir(tmp_path / "node-cache" / "o"))
