"""Odd objects in a bucket read as the same bytes on disk read: empty objects, blank
lines only, a last line without a newline, damaged compressed objects, a Parquet
footer cut short, keys with spaces and non-ASCII characters, a glob that matches
nothing.  Each case: the same outcome (documents and their ids, or the same error
with the path in place of the URL) from the local file and from s3:// (moto_server
through the fault proxy)."""

import gzip
import io
import json
import os
import warnings

import numpy as np
import pytest

import polyload
from polyload import ConfigWarning, _core
from s3_fixtures import s3env, s3_environ  # noqa: F401

import fortunes_corpus as fc

BUCKET = "pl-edge"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return fc.build(tmp_path_factory.mktemp("fortunes"))


def _cfg(c, src, cache=None):
    cfg = fc.config(c, **{"tokenizer": {"type": "hf", "path": c["tokenizer"]},
                          "train_steps": 2})
    cfg["sources"] = [dict(src, name="s", weight=1.0)]
    if cache is not None:
        cfg["cache"] = cache
    return cfg


def _outcome(cfg, path):
    """('open error', message) or ('ok', [ids or ('error', message) per document]);
    the path or URL in messages replaced by <P>."""
    def clean(msg):
        return str(msg).replace(path, "<P>")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigWarning)
            src = _core.Config.parse_string(json.dumps(cfg), origin="t").open_source(0)
    except Exception as e:  # noqa: BLE001 - the comparison is the test
        return ("open error", type(e).__name__, clean(e))
    docs = []
    for d in range(src.num_documents):
        try:
            docs.append(np.asarray(src.read(d)).tolist())
        except Exception as e:  # noqa: BLE001
            docs.append(("error", type(e).__name__, clean(e)))
    return ("ok", docs)


def _same(c, s3env, tmp_path, key, data, src, cache=None):
    local = tmp_path / "local" / key
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(data)
    s3env.bucket(BUCKET)
    s3env.put(BUCKET, key, data)
    url = f"s3://{BUCKET}/{key}"
    cache = dict({"dir": str(tmp_path / "cache")}, **(cache or {}))
    got_local = _outcome(_cfg(c, dict(src, path=str(local))), str(local))
    got_remote = _outcome(_cfg(c, dict(src, path=url), cache), url)
    assert got_remote == got_local
    return got_local


LINES = [json.dumps({"text": t}) for t in ("one small record", "a second one", "três")]


@pytest.mark.parametrize("case,data", [
    ("empty", b""),
    ("blank", b"\n\n  \n\r\n\t\n"),
    ("no_final_newline", "\n".join(LINES).encode()),
    ("crlf", "\r\n".join(LINES).encode() + b"\r\n"),
    ("bad_last", ("\n".join(LINES) + '\n{"text": "cut').encode()),
])
def test_jsonl_plain(case, data, corpus, s3env, s3_environ, tmp_path):
    _same(corpus, s3env, tmp_path, f"plain/{case}.jsonl", data, {"type": "jsonl"})


def _gz(b):
    return gzip.compress(b, mtime=0)


BODY = ("\n".join(LINES * 50) + "\n").encode()


@pytest.mark.parametrize("case,data", [
    ("empty_object", b""),
    ("empty_stream", _gz(b"")),
    ("truncated", _gz(BODY)[:-30]),
    ("corrupt", (lambda z: z[:40] + bytes([z[40] ^ 0xFF]) + z[41:])(_gz(BODY))),
    ("trailing_zeros", _gz(BODY) + b"\0" * 64),
    ("two_members", _gz(BODY[:100]) + _gz(BODY[100:])),
])
def test_jsonl_gz(case, data, corpus, s3env, s3_environ, tmp_path):
    _same(corpus, s3env, tmp_path, f"gz/{case}.jsonl.gz", data, {"type": "jsonl"})


@pytest.mark.parametrize("case,data", [
    ("empty", b""),
    ("truncated", None),
])
def test_jsonl_zst(case, data, corpus, s3env, s3_environ, tmp_path):
    import pyarrow as pa
    if data is None:
        data = pa.compress(BODY, "zstd", asbytes=True)[:-7]
    _same(corpus, s3env, tmp_path, f"zst/{case}.jsonl.zst", data, {"type": "jsonl"})


def test_key_with_spaces_and_unicode(corpus, s3env, s3_environ, tmp_path):
    got = _same(corpus, s3env, tmp_path, "dir with space/ünï cödé+%20.jsonl", BODY,
                {"type": "jsonl"})
    assert got[0] == "ok" and len(got[1]) == 150


@pytest.mark.parametrize("data", [b"", b"only text\n", "ünï\n".encode()])
def test_text_objects(data, corpus, s3env, s3_environ, tmp_path):
    _same(corpus, s3env, tmp_path, f"text/{len(data)}.txt", data, {"type": "text"})


def test_glob_matching_nothing(corpus, s3env, s3_environ, tmp_path):
    s3env.bucket(BUCKET)
    url = f"s3://{BUCKET}/nothing-here/*.jsonl"
    got = _outcome(_cfg(corpus, {"type": "jsonl", "path": url},
                        {"dir": str(tmp_path / "cache")}), url)
    assert got[0] == "open error" and "<P>" in got[2], got


def _parquet():
    import pyarrow as pa
    import pyarrow.parquet as pq
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [json.loads(x)["text"] for x in LINES] * 30}), buf,
                   row_group_size=20)
    return buf.getvalue()


@pytest.mark.parametrize("case", ["footer_len", "footer_bytes", "no_magic", "cut"])
def test_parquet_damaged(case, corpus, s3env, s3_environ, tmp_path):
    pytest.importorskip("pyarrow")
    b = bytearray(_parquet())
    if case == "footer_len":
        b[-8:-4] = (len(b) * 2).to_bytes(4, "little")
    elif case == "footer_bytes":
        n = int.from_bytes(b[-8:-4], "little")
        for i in range(len(b) - 8 - n, len(b) - 8, 7):
            b[i] ^= 0x5A
    elif case == "no_magic":
        b[-4:] = b"XXXX"
    else:
        b = b[: len(b) // 2]
    _same(corpus, s3env, tmp_path, f"pq/{case}.parquet", bytes(b), {"type": "parquet"})


def _docs(n, tag):
    return ("\n".join(json.dumps({"text": f"{tag} record number {i:05d} of the object"})
                      for i in range(n)) + "\n").encode()


_CHILD = r"""
import hashlib, json, sys, warnings
import polyload
cfg = json.loads(sys.argv[1])
out = []
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with polyload.Loader(cfg, rank=0) as ld:
        for b in ld:
            h = hashlib.sha256()
            for k in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens"):
                h.update(b[k].numpy().tobytes())
            out.append(h.hexdigest())
print(json.dumps(out))
"""


def test_two_processes_tiny_cache_many_sources(corpus, s3env, s3_environ, tmp_path,
                                               monkeypatch):
    """Eight remote sources through one tiny cache (two chunks; a chunk may leave 1 s
    after its last use) shared by two processes at once: each gets the batches of the
    local files.  (With a grace of 0 the processes evict each other's chunks mid-read
    and one fails at open with PL_EIO naming the object: an error, never wrong bytes.)"""
    import subprocess
    import sys
    monkeypatch.setenv("POLYLOAD_CACHE_GRACE_S", "1")
    s3env.bucket(BUCKET)
    srcs_l, srcs_r = [], []
    for i in range(8):
        body = _docs(60 + 13 * i, f"src{i}")
        p = tmp_path / f"m{i}.jsonl"
        p.write_bytes(body)
        s3env.put(BUCKET, f"many/m{i}.jsonl", body)
        srcs_l.append({"name": f"m{i}", "type": "jsonl", "path": str(p), "weight": 1.0})
        srcs_r.append(dict(srcs_l[-1], path=f"s3://{BUCKET}/many/m{i}.jsonl"))
    base = fc.config(corpus, **{"tokenizer": {"type": "hf", "path": corpus["tokenizer"]},
                                "train_steps": 6})
    base["topology"] = {"dp": 1}
    local = dict(base, sources=srcs_l)
    remote = dict(base, sources=srcs_r,
                  cache={"dir": str(tmp_path / "shared"), "max_bytes": 8192,
                         "chunk_bytes": 4096})
    env = dict(os.environ)
    run = lambda cfg: subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(cfg)],  # noqa: E731
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       env=env, text=True)
    want = run(local).communicate()
    procs = [run(remote) for _ in range(2)]
    outs = [p.communicate() for p in procs]
    assert want[0].strip(), want[1]
    for (o, e), p in zip(outs, procs):
        assert p.returncode == 0, e
        assert json.loads(o) == json.loads(want[0])


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(
        "make_vlm_corpus", os.path.join(root, "scripts", "make_vlm_corpus.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("vlm1")
    mod.write_shards(mod.samples(), str(out), 8)
    return (out / "shard-000000.tar").read_bytes()


def _wds_outcome(path):
    def clean(msg):
        return str(msg).replace(path, "<P>")
    try:
        src = _core.Source.open_webdataset(path, 300, mode="fixed", index=-1)
    except Exception as e:  # noqa: BLE001
        return ("open error", type(e).__name__, clean(e))
    out = []
    for k in range(len(src)):
        try:
            out.append((np.asarray(src.read(k)).tolist(),
                        np.asarray(src.read_image(k)).tobytes()))
        except Exception as e:  # noqa: BLE001
            out.append(("error", type(e).__name__, clean(e)))
    return ("ok", out)


def _member_offsets(tar):
    """(header offset, data offset, data size) of each member."""
    out, at = [], 0
    while at + 512 <= len(tar) and tar[at:at + 512].strip(b"\0"):
        size = int(tar[at + 124:at + 136].strip(b" \0") or b"0", 8)
        out.append((at, at + 512, size))
        at += 512 + (size + 511) // 512 * 512
    return out


@pytest.mark.parametrize("case", ["empty", "end_blocks_only", "mid_header", "mid_data",
                                  "at_boundary", "mid_padding"])
def test_webdataset_cut_shard(case, shard, s3env, s3_environ, tmp_path):
    m = _member_offsets(shard)
    assert len(m) >= 6
    h, d, n = m[len(m) // 2]
    data = {"empty": b"", "end_blocks_only": b"\0" * 1024,
            "mid_header": shard[:h + 100], "mid_data": shard[:d + n // 2],
            "at_boundary": shard[:h], "mid_padding": shard[:d + n + 3]}[case]
    local = tmp_path / "local" / f"{case}.tar"
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(data)
    s3env.bucket(BUCKET)
    s3env.put(BUCKET, f"wds/{case}.tar", data)
    url = f"s3://{BUCKET}/wds/{case}.tar"
    assert _wds_outcome(url) == _wds_outcome(str(local))


def _pq_bytes(tag, n=400):
    import pyarrow as pa
    import pyarrow.parquet as pq
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [f"{tag} row {i:05d} of the table" for i in range(n)]}),
                   buf, row_group_size=25, compression="none")
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["parquet_same_size", "jsonl_same_size", "jsonl_longer",
                                  "jsonl_shorter"])
def test_object_replaced_after_open_never_reads_mixed(kind, corpus, s3env, s3_environ, tmp_path,
                                         monkeypatch):
    """A tiny cache, the object's chunks pushed out by another object's, then the
    object replaced in the bucket: each document reads as at open or fails naming the
    replacement; none reads the new object's bytes."""
    pytest.importorskip("pyarrow")
    monkeypatch.setenv("POLYLOAD_CACHE_GRACE_S", "0")
    if kind == "parquet_same_size":
        old, new, typ, key = _pq_bytes("old"), _pq_bytes("new"), "parquet", "r/a.parquet"
        assert len(old) == len(new)
    elif kind == "jsonl_same_size":
        old, new, typ, key = _docs(300, "old"), _docs(300, "new"), "jsonl", "r/s.jsonl"
        assert len(old) == len(new)
    elif kind == "jsonl_longer":
        old, new, typ, key = _docs(300, "old"), _docs(600, "new"), "jsonl", "r/b.jsonl"
    else:
        old, new, typ, key = _docs(300, "old"), _docs(100, "new"), "jsonl", "r/c.jsonl"
    local = tmp_path / ("old." + typ)
    local.write_bytes(old)
    want = _outcome(_cfg(corpus, {"type": typ, "path": str(local)}), str(local))[1]
    s3env.bucket(BUCKET)
    s3env.put(BUCKET, key, old)
    url = f"s3://{BUCKET}/{key}"
    cfg = _cfg(corpus, {"type": typ, "path": url},
               {"dir": str(tmp_path / "cache"), "max_bytes": 8192, "chunk_bytes": 4096})
    src = _core.Config.parse_string(json.dumps(cfg), origin="t").open_source(0)
    # Another object read through the same cache pushes the first one's chunks out.
    s3env.put(BUCKET, "r/other.jsonl", _docs(2000, "other"))
    other = dict(cfg, sources=[dict(cfg["sources"][0], type="jsonl",
                                    path=f"s3://{BUCKET}/r/other.jsonl")])
    _core.Config.parse_string(json.dumps(other), origin="t").open_source(0)
    s3env.put(BUCKET, key, new)
    s3env.faults(reset=True)
    failed = 0
    for d in list(range(0, src.num_documents, 5))[::-1]:
        try:
            got = np.asarray(src.read(d)).tolist()
        except Exception as e:  # noqa: BLE001
            assert "replaced" in str(e) and url in str(e), str(e)
            failed += 1
            continue
        assert got == want[d], d
    assert s3env.stats()["GET"] > 0 and failed > 0


@pytest.mark.parametrize("key", ["k/a=b&c.jsonl", "k/q?x.jsonl", "k/h#1.jsonl",
                                 "k/t~i*l'd(1)!.jsonl", "k/s$,;:@.jsonl", "k/p%2Fq.jsonl",
                                 "k/a+b.jsonl", "k//double.jsonl", "k/\u4e2d\u6587.jsonl"])
def test_keys_with_reserved_characters(key, corpus, s3env, s3_environ, tmp_path):
    """Keys whose characters must be escaped in the request (and signed escaped)."""
    s3env.bucket(BUCKET)
    s3env.put(BUCKET, key, BODY)
    url = f"s3://{BUCKET}/{key}"
    got = _outcome(_cfg(corpus, {"type": "jsonl", "path": url},
                        {"dir": str(tmp_path / "cache")}), url)
    local = tmp_path / "l.jsonl"
    local.write_bytes(BODY)
    assert got == _outcome(_cfg(corpus, {"type": "jsonl", "path": str(local)}), str(local))


def test_glob_over_keys_with_spaces_and_unicode(corpus, s3env, s3_environ, tmp_path):
    s3env.bucket(BUCKET)
    ldir = tmp_path / "l" / "dir \u00fc x"
    ldir.mkdir(parents=True)
    for i, name in enumerate(["a b.jsonl", "\u00e9t\u00e9.jsonl", "z+1.jsonl"]):
        body = _docs(20 + i, f"g{i}")
        (ldir / name).write_bytes(body)
        s3env.put(BUCKET, f"gl/dir \u00fc x/{name}", body)
    s3env.put(BUCKET, "gl/dir \u00fc x/skip.txt", b"not matched\n")
    lpat = str(ldir / "*.jsonl")
    rpat = f"s3://{BUCKET}/gl/dir \u00fc x/*.jsonl"
    want = _outcome(_cfg(corpus, {"type": "jsonl", "path": lpat}), lpat)
    got = _outcome(_cfg(corpus, {"type": "jsonl", "path": rpat},
                        {"dir": str(tmp_path / "cache")}), rpat)
    assert want[0] == "ok" and len(want[1]) == 20 + 21 + 22
    assert got == want


@pytest.mark.parametrize("kind", ["truncate", "http503", "cut"])
def test_tiny_cache_under_faults_every_type(kind, corpus, shard, s3env, s3_environ, tmp_path,
                                            monkeypatch):
    """JSON Lines (plain and .gz), Parquet and a WebDataset shard through a cache of
    four chunks, every third GET spoiled: the documents (and images) of the local files."""
    pytest.importorskip("pyarrow")
    monkeypatch.setenv("POLYLOAD_CACHE_GRACE_S", "0")
    s3env.bucket(BUCKET)
    files = {"f/a.jsonl": _docs(300, "plain"), "f/b.jsonl.gz": _gz(_docs(300, "gz")),
             "f/c.parquet": _pq_bytes("pq", 300)}
    for key, body in files.items():
        p = tmp_path / "l" / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body)
        s3env.put(BUCKET, key, body)
    cache = {"dir": str(tmp_path / "cache"), "max_bytes": 4 * 4096, "chunk_bytes": 4096}
    want = {}
    for key in files:
        typ = "parquet" if key.endswith(".parquet") else "jsonl"
        lp = str(tmp_path / "l" / key)
        want[key] = _outcome(_cfg(corpus, {"type": typ, "path": lp}), lp)
    (tmp_path / "l" / "s.tar").write_bytes(shard)
    s3env.put(BUCKET, "f/s.tar", shard)
    want_wds = _wds_outcome(str(tmp_path / "l" / "s.tar"))
    s3env.faults(reset=True, every=3, kind=kind)
    for key in files:
        typ = "parquet" if key.endswith(".parquet") else "jsonl"
        url = f"s3://{BUCKET}/{key}"
        assert _outcome(_cfg(corpus, {"type": typ, "path": url}, cache), url) == want[key], key
    monkeypatch.setenv("POLYLOAD_CACHE_MAX_BYTES", str(64 * 1024))
    assert want_wds[0] == "ok" and len(want_wds[1]) == 8
    assert _wds_outcome(f"s3://{BUCKET}/f/s.tar") == want_wds
    assert s3env.stats()["injected"] > 0


@pytest.mark.parametrize("typ", ["jsonl", "text"])
def test_folder_marker_objects(typ, corpus, s3env, s3_environ, tmp_path):
    """Zero-byte "folder" objects (keys ending in /, as consoles and some tools create)
    are not files of a directory path: the same documents as the local directory."""
    s3env.bucket(BUCKET)
    ext = "jsonl" if typ == "jsonl" else "txt"
    body = _docs(10, "m") if typ == "jsonl" else b"one text document\n"
    ldir = tmp_path / "l"
    (ldir / "sub").mkdir(parents=True)
    (ldir / f"a.{ext}").write_bytes(body)
    (ldir / "sub" / f"b.{ext}").write_bytes(body)
    pre = f"mk-{typ}"
    for key, data in ((f"{pre}/", b""), (f"{pre}/sub/", b""), (f"{pre}/a.{ext}", body),
                      (f"{pre}/sub/b.{ext}", body)):
        s3env.put(BUCKET, key, data)
    want = _outcome(_cfg(corpus, {"type": typ, "path": str(ldir) + "/"}), str(ldir) + "/")
    url = f"s3://{BUCKET}/{pre}/"
    got = _outcome(_cfg(corpus, {"type": typ, "path": url}, {"dir": str(tmp_path / "c")}),
                   url)
    assert want[0] == "ok"
    assert got == want


@pytest.mark.parametrize("typ", ["text", "jsonl"])
def test_one_object_opened_with_two_chunk_sizes(typ, corpus, s3env, s3_environ, tmp_path,
                                                monkeypatch):
    """One cache directory, one object opened by two sources whose caches have different
    chunk_bytes (two jobs on a node, or two loaders of a process, configured apart): the
    second open must not spoil what the first reads (it read holes as bytes: zeros)."""
    monkeypatch.setenv("POLYLOAD_CACHE_GRACE_S", "0")
    if typ == "jsonl":
        body = _docs(24000, "chunks")
    else:
        body = "".join(f"line {i:05d} of a long text document\n" for i in range(36000)).encode()
    assert len(body) > 17 * 65536
    key = f"chunks/{typ}.obj"
    s3env.bucket(BUCKET)
    s3env.put(BUCKET, key, body)
    local = tmp_path / "x"
    local.write_bytes(body)
    url = f"s3://{BUCKET}/{key}"

    def cfg(path, chunk, t=typ):
        return _cfg(corpus, {"type": t, "path": path},
                    {"dir": str(tmp_path / "cache"), "chunk_bytes": chunk})

    loc = _core.Config.parse_string(json.dumps(_cfg(corpus, {"type": typ, "path": str(local)})),
                                    origin="t").open_source(0)
    a = _core.Config.parse_string(json.dumps(cfg(url, 4096)), origin="t").open_source(0)
    # The same object through 64 KiB chunks (as Parquet: only its first and last chunks
    # are fetched before the open fails, the object being no Parquet file).
    with pytest.raises(polyload.PolyloadError, match="not a Parquet file"):
        _core.Config.parse_string(json.dumps(cfg(url, 65536, "parquet")),
                                  origin="t").open_source(0)
    assert a.num_documents == loc.num_documents
    for d in range(a.num_documents):
        assert np.asarray(a.read(d)).tolist() == np.asarray(loc.read(d)).tolist(), d


def test_webdataset_default_index_on_a_remote_shard(shard, s3env, s3_environ, tmp_path):
    """The default index policy (a sidecar beside the shard) on a shard in a bucket: the
    local outcome, and nothing written into the bucket."""
    s3env.bucket(BUCKET)
    s3env.put(BUCKET, "wdsidx/s.tar", shard)
    (tmp_path / "s.tar").write_bytes(shard)
    url = f"s3://{BUCKET}/wdsidx/s.tar"
    s3env.faults(reset=True)
    src = _core.Source.open_webdataset(url, 300, mode="fixed")
    loc = _core.Source.open_webdataset(str(tmp_path / "s.tar"), 300, mode="fixed")
    assert len(src) == len(loc) == 8
    for k in range(len(loc)):
        assert np.asarray(src.read(k)).tolist() == np.asarray(loc.read(k)).tolist()
    assert s3env.stats()["PUT"] == 0
    # Opened again (a sidecar, if one was kept in the cache, read back): the same.
    again = _core.Source.open_webdataset(url, 300, mode="fixed")
    assert [np.asarray(again.read(k)).tolist() for k in range(8)] == \
        [np.asarray(loc.read(k)).tolist() for k in range(8)]


def test_listing_keys_with_xml_special_characters(corpus, s3env, s3_environ, tmp_path):
    """A directory path whose keys hold & < > " ' (escaped in the listing's XML): every
    object is found and read, as the local directory's files are."""
    s3env.bucket(BUCKET)
    ldir = tmp_path / "l"
    ldir.mkdir()
    names = ["a&b.jsonl", "c<d>.jsonl", "e\"f'.jsonl", "plain.jsonl"]
    for i, name in enumerate(names):
        body = _docs(5 + i, f"x{i}")
        (ldir / name).write_bytes(body)
        s3env.put(BUCKET, f"xml/{name}", body)
    want = _outcome(_cfg(corpus, {"type": "jsonl", "path": str(ldir) + "/"}),
                    str(ldir) + "/")
    url = f"s3://{BUCKET}/xml/"
    got = _outcome(_cfg(corpus, {"type": "jsonl", "path": url},
                        {"dir": str(tmp_path / "c")}), url)
    assert want[0] == "ok" and len(want[1]) == 5 + 6 + 7 + 8
    assert got == want


def test_listing_past_one_page(corpus, s3env, s3_environ, tmp_path):
    """A directory of 1,010 objects (a listing answers 1,000 keys a page): all read."""
    s3env.bucket(BUCKET)
    c = s3env.client(direct=True)
    for i in range(1010):
        c.put_object(Bucket=BUCKET, Key=f"page/d{i:05d}.txt", Body=f"doc {i}\n".encode())
    url = f"s3://{BUCKET}/page/"
    got = _outcome(_cfg(corpus, {"type": "text", "path": url},
                        {"dir": str(tmp_path / "c")}), url)
    assert got[0] == "ok" and len(got[1]) == 1010
