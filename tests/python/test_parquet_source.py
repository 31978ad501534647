"""Raw text sources of ``type: parquet``: a string column read through Apache
Arrow's C++ Parquet reader inside the C library, on the fortunes corpus written to Parquet
by pyarrow (the real writer).

- every document's ids equal those of the same text in a jsonl source with the same
  tokenizer, across several row groups and files (a directory, a glob);
- a parquet source gives exactly the batches of the same text as jsonl (and so of the
  text prepared offline);
- another schema, a truncated or corrupt file, nulls, empty strings, invalid UTF-8: clear
  errors naming the file, the row (row group) and the byte offset; with on_error: skip they
  are skipped and counted, the same on every rank.
"""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import polyload
from polyload import _core

import fortunes_corpus as fc


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    c = dict(fc.build(tmp_path_factory.mktemp("fortunes")))
    pdir = tmp_path_factory.mktemp("parquet")
    c["texts"] = {n: _texts(os.path.join(c["dir"], f"{n}.jsonl")) for n in ("tech", "wit")}
    # tech: one file, row groups of 100 rows, with another column before the text;
    # wit: a directory of two files (snappy, dictionary-encoded pages), split unevenly.
    pq.write_table(pa.table({"id": np.arange(len(c["texts"]["tech"])),
                             "text": c["texts"]["tech"]}),
                   str(pdir / "tech.parquet"), row_group_size=100)
    wit = c["texts"]["wit"]
    os.makedirs(pdir / "wit")
    pq.write_table(pa.table({"text": wit[:250]}), str(pdir / "wit" / "a.parquet"),
                   row_group_size=64)
    pq.write_table(pa.table({"text": wit[250:]}), str(pdir / "wit" / "b.parquet"),
                   row_group_size=1000, compression="zstd")
    c["parquet"] = {"tech": str(pdir / "tech.parquet"), "wit": str(pdir / "wit")}
    return c


def _texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def _config(corpus, kind, **overrides):
    cfg = fc.config(corpus, tokenizer={"type": "hf", "path": corpus["tokenizer"]}, **overrides)
    cfg["sources"] = [
        {"name": n, "type": kind, "weight": w,
         "path": corpus["parquet"][n] if kind == "parquet"
         else os.path.join(corpus["dir"], f"{n}.jsonl")}
        for n, w in (("tech", 0.6), ("wit", 0.4))]
    return cfg


_source = fc.open_source


_hashes = fc.batch_hashes


def test_ids_equal_the_jsonl_source(corpus):
    pcfg, jcfg = _config(corpus, "parquet"), _config(corpus, "jsonl")
    for i, name in enumerate(("tech", "wit")):
        p, j = _source(pcfg, i), _source(jcfg, i)
        assert p.type == "parquet" and p.num_documents == len(corpus["texts"][name])
        assert p.num_files == (1 if name == "tech" else 2)
        for d in range(p.num_documents):
            assert np.asarray(p.read(d)).tolist() == np.asarray(j.read(d)).tolist(), (name, d)
        assert p.num_tokenized == p.num_documents  # each document once


def test_glob_and_text_key(corpus, tmp_path):
    texts = corpus["texts"]["wit"][:90]
    for k in range(3):
        pq.write_table(pa.table({"body": texts[30 * k:30 * k + 30]}),
                       str(tmp_path / f"part-{k}.parquet"), row_group_size=7)
    cfg = fc.config(corpus)
    cfg["sources"] = [{"name": "g", "type": "parquet", "path": str(tmp_path / "part-*.parquet"),
                       "text_key": "body",
                       "tokenizer": {"type": "hf", "path": corpus["tokenizer"],
                                     "add_eos": False}}]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(corpus["tokenizer"])
    src = _source(cfg, 0)
    assert src.num_files == 3 and src.num_documents == 90
    for d, enc in enumerate(tok.encode_batch(texts, add_special_tokens=False)):
        assert np.asarray(src.read(d)).tolist() == enc.ids, d


def test_batches_equal_jsonl_and_prepared(corpus):
    p = _hashes(_config(corpus, "parquet"), 25)
    assert len(p) == 2 * 25 * 2
    assert p == _hashes(_config(corpus, "jsonl"), 25) == _hashes(fc.config(corpus), 25)
    assert _hashes(_config(corpus, "parquet", seed=5), 2) != p[:4]


# ------------------------------------------------------------------------ bad input


def _open_one(corpus, path, **src):
    cfg = fc.config(corpus, tokenizer={"type": "hf", "path": corpus["tokenizer"]})
    cfg["sources"] = [dict({"name": "p", "type": "parquet", "path": str(path)}, **src)]
    return _source(cfg, 0)


def test_other_schema_is_a_clear_error(corpus, tmp_path):
    pq.write_table(pa.table({"body": ["a", "b"], "n": [1, 2]}), str(tmp_path / "nokey.parquet"))
    with pytest.raises(polyload.PolyloadError,
                       match=r"nokey.parquet: no column 'text' in the file's schema "
                             r"\(columns: body, n\)"):
        _open_one(corpus, tmp_path / "nokey.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), str(tmp_path / "int.parquet"))
    with pytest.raises(polyload.PolyloadError,
                       match=r"int.parquet: column 'text' is INT64, not a string column"):
        _open_one(corpus, tmp_path / "int.parquet")
    pq.write_table(pa.table({"text": pa.array([b"x"], pa.binary())}),
                   str(tmp_path / "bin.parquet"))
    with pytest.raises(polyload.PolyloadError, match="bin.parquet: column 'text' is BYTE_ARRAY, not a string"):
        _open_one(corpus, tmp_path / "bin.parquet")
    pq.write_table(pa.table({"text": pa.array([["x"]], pa.list_(pa.string()))}),
                   str(tmp_path / "list.parquet"))
    with pytest.raises(polyload.PolyloadError, match="no column 'text'"):
        _open_one(corpus, tmp_path / "list.parquet")  # its leaf is text.list.element


def test_truncated_and_corrupt_files(corpus, tmp_path):
    good = open(corpus["parquet"]["tech"], "rb").read()
    (tmp_path / "cut.parquet").write_bytes(good[:len(good) - 300])
    with pytest.raises(polyload.PolyloadError,
                       match=rf"cut.parquet: truncated Parquet file: no \"PAR1\" footer magic "
                             rf"at byte offset {len(good) - 304}"):
        _open_one(corpus, tmp_path / "cut.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"{\"text\": \"not parquet\"}\n" * 10)
    with pytest.raises(polyload.PolyloadError, match="junk.parquet: not a Parquet file"):
        _open_one(corpus, tmp_path / "junk.parquet")
    bad = bytearray(good)
    bad[-8:-4] = (len(good) * 2).to_bytes(4, "little")
    (tmp_path / "footer.parquet").write_bytes(bytes(bad))
    with pytest.raises(polyload.PolyloadError, match="footer.parquet: corrupt Parquet footer"):
        _open_one(corpus, tmp_path / "footer.parquet")


def _damaged_corpus(corpus, tmp_path):
    """tech as Parquet with row group 3's page header overwritten, a null, an empty
    string and invalid UTF-8 in other rows; the rows that are bad."""
    texts = list(corpus["texts"]["tech"])
    data = [t.encode() for t in texts]
    data[5], data[6] = None, b""
    data[7] = b"bad \xff utf-8"
    arr = pa.array(data, pa.binary()).view(pa.string())  # the writer does not validate
    path = tmp_path / "damaged.parquet"
    pq.write_table(pa.table({"text": arr}), str(path), row_group_size=100, compression="none",
                   use_dictionary=False)
    off = pq.ParquetFile(str(path)).metadata.row_group(3).column(0).data_page_offset
    raw = bytearray(path.read_bytes())
    raw[off:off + 40] = b"\xff" * 40
    path.write_bytes(bytes(raw))
    return str(path), off, [5, 6, 7] + list(range(300, 400))


def test_bad_rows_name_file_row_and_offset(corpus, tmp_path):
    path, off, bad = _damaged_corpus(corpus, tmp_path)
    src = _open_one(corpus, path)
    assert src.num_documents == len(corpus["texts"]["tech"])  # the footer is intact
    chunk0 = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    for d, what in ((5, "column 'text' is null"), (6, "empty document"),
                    (7, "invalid UTF-8 at byte 4 of the value")):
        with pytest.raises(polyload.PolyloadError,
                           match=rf"damaged.parquet: row {d} \(row group 0, row {d} of the "
                                 rf"group; column chunk at byte offset {chunk0}\): {what}"):
            src.read(d)
    with pytest.raises(polyload.PolyloadError,
                       match=rf"row 342 \(row group 3, row 42 of the group; column chunk at "
                             rf"byte offset {off}\): cannot decode the column chunk"):
        src.read(342)
    assert np.asarray(src.read(400)).size > 0  # the next row group is read


def test_bad_rows_skipped_and_counted_same_on_every_rank(corpus, tmp_path):
    path, _, bad = _damaged_corpus(corpus, tmp_path)
    cfg = fc.config(corpus, tokenizer={"type": "hf", "path": corpus["tokenizer"]},
                    train_steps=60)
    cfg["sources"] = [{"name": "p", "type": "parquet", "path": path, "weight": 1.0}]
    with pytest.raises(polyload.PolyloadError, match=r"damaged.parquet: row \d+"):
        with polyload.Loader(cfg, rank=0) as loader:
            for _ in loader:
                pass
    cfg["on_error"] = "skip"
    skipped, hashes = [], []
    for rank in range(2):
        with polyload.Loader(cfg, rank=rank) as loader:
            h = [b["input_ids"].numpy().tobytes() for b in loader]
            skipped.append(loader.stats()["skipped"])
            hashes.append(h)
    assert skipped[0] == skipped[1] and skipped[0] > 0
    assert hashes[0] != hashes[1]
    # a file that cannot be opened is left out (counted once) under on_error: skip
    (tmp_path / "dir").mkdir()
    pq.write_table(pa.table({"text": corpus["texts"]["wit"]}), str(tmp_path / "dir" / "a.parquet"))
    pq.write_table(pa.table({"other": ["x"]}), str(tmp_path / "dir" / "b.parquet"))
    cfg["sources"][0]["path"] = str(tmp_path / "dir")
    cfg["train_steps"] = 3
    with polyload.Loader(cfg, rank=0) as loader:
        for _ in loader:
            pass
        assert loader.stats()["skipped"] == 1
    cfg["on_error"] = "fail"
    with pytest.raises(polyload.PolyloadError, match="b.parquet: no column 'text'"):
        polyload.Loader(cfg, rank=0)


def test_empty_file_opens_with_no_rows(corpus, tmp_path):
    """pyarrow writes an empty table as one row group of 0 rows whose column chunk has
    data_page_offset 0: a valid file of no documents, not a corrupt footer (it was
    refused, and with it a directory holding one such shard)."""
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), str(tmp_path / "e.parquet"))
    assert pq.ParquetFile(str(tmp_path / "e.parquet")).metadata.num_row_groups == 1
    assert _open_one(corpus, tmp_path / "e.parquet").num_documents == 0
    (tmp_path / "d").mkdir()
    texts = corpus["texts"]["wit"][:50]
    pq.write_table(pa.table({"text": texts}), str(tmp_path / "d" / "a.parquet"))
    os.replace(tmp_path / "e.parquet", tmp_path / "d" / "b.parquet")
    src = _open_one(corpus, tmp_path / "d")
    assert src.num_documents == 50
    assert np.asarray(src.read(49)).size > 0


def test_file_changed_while_open_is_not_a_damaged_row(corpus, tmp_path):
    """A file cut short or rewritten in place after it was opened (its footer is the
    old one) is PL_ETRUNC / PL_EIO saying so, naming file, row and offset, rather than
    'cannot decode the column chunk' (ERECORD: a damaged row); one replaced by a rename
    is still read from the file that was opened."""
    texts = corpus["texts"]["tech"][:300]
    cut, inplace, renamed = (str(tmp_path / f"{n}.parquet") for n in ("cut", "inplace", "ren"))
    for p in (cut, inplace, renamed):
        pq.write_table(pa.table({"text": texts}), p, row_group_size=100, compression="none",
                       use_dictionary=False)
    want = [np.asarray(_open_one(corpus, renamed).read(d)).tolist() for d in (150, 250)]
    s_cut, s_in, s_ren = (_open_one(corpus, p) for p in (cut, inplace, renamed))
    assert np.asarray(s_cut.read(10)).size > 0  # row group 0 decoded before the change
    size = os.path.getsize(cut)
    with open(cut, "r+b") as f:
        f.truncate(size // 3)
    off = pq.ParquetFile(inplace).metadata.row_group(2).column(0).data_page_offset
    with open(inplace, "r+b") as f:  # same size, other bytes in a data page
        f.seek(off + 100)
        f.write(b"x" * 50)
    st = os.stat(inplace)
    os.utime(inplace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    pq.write_table(pa.table({"text": corpus["texts"]["tech"][300:600]}), renamed + ".tmp",
                   row_group_size=100)
    os.replace(renamed + ".tmp", renamed)
    with pytest.raises(polyload.PolyloadError,
                       match=rf"cut.parquet: row 250 \(row group 2, row 50 of the group; "
                             rf"column chunk at byte offset \d+\): the file changed since it "
                             rf"was opened \({size} bytes then, {size // 3} now\)") as e:
        s_cut.read(250)
    assert e.value.code == _core.ETRUNC
    assert np.asarray(s_cut.read(10)).size > 0  # what was decoded before stays
    with pytest.raises(polyload.PolyloadIOError,
                       match=rf"inplace.parquet: row 250 \(row group 2, .*modified in place"):
        s_in.read(250)
    assert [np.asarray(s_ren.read(d)).tolist() for d in (150, 250)] == want
