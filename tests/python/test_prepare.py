"""polyload prepare: text -> Megatron indexed dataset, checked by decoding it back."""

import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from polyload import prepare as pp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DOCS = [
    "The quick brown fox jumps over the lazy dog.\nA second line, with    spaces.\n",
    "def add(a, b):\n    return a + b  # a comment\n\n\tprint(add(1, 2))\n",
    "Größenänderung: Die Datei wird übersetzt. Ça marche très bien, à bientôt !",
    "名前\nzic - タイムゾーンコンパイラ。ファイルからテキストを読む。",
    "emoji 🙂 and a literal <|endoftext|> marker inside a document",
    " leading space and trailing newline\n",
    "x",
]


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory):
    """A small byte-level BPE trained by polyload's own train_tokenizer on DOCS."""
    d = tmp_path_factory.mktemp("tok")
    corpus = d / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS * 20), encoding="utf-8")
    out = d / "tokenizer.json"
    pp.train_tokenizer([str(corpus)], str(out), vocab_size=400, min_frequency=1)
    return str(out)


@pytest.fixture(scope="session")
def tok(tokenizer_path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(tokenizer_path)


def write_jsonl(path, texts, key="text"):
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({key: t, "source": "test"}, ensure_ascii=False) + "\n")


def load_megatron(prefix):
    """Decode PREFIX.idx/.bin with numpy alone (independent of polyload's reader):
    returns (dtype, document_indices, [token arrays])."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack_from("<Q", idx, 9)[0] == 1
    dtype = {4: np.int32, 8: np.uint16}[idx[17]]
    n_seq, n_doc = struct.unpack_from("<QQ", idx, 18)
    off = 34
    lengths = np.frombuffer(idx, np.int32, n_seq, off)
    off += 4 * n_seq
    pointers = np.frombuffer(idx, np.int64, n_seq, off)
    off += 8 * n_seq
    doc_idx = np.frombuffer(idx, np.int64, n_doc, off)
    assert off + 8 * n_doc == len(idx)
    data = np.fromfile(prefix + ".bin", dtype=dtype)
    item = np.dtype(dtype).itemsize
    assert int(lengths.sum()) == data.size
    seqs = [data[p // item : p // item + n] for p, n in zip(pointers, lengths)]
    return dtype, doc_idx, seqs


def test_jsonl_round_trip(tmp_path, tokenizer_path, tok):
    src = tmp_path / "docs.jsonl"
    write_jsonl(src, DOCS)
    with open(src, "a") as f:
        f.write("\n   \n")  # blank lines are not documents
    prefix = str(tmp_path / "out" / "docs_text_document")
    st = pp.prepare([str(src)], prefix, tokenizer_path, writer="numpy")

    dtype, doc_idx, seqs = load_megatron(prefix)
    eod = tok.token_to_id("<|endoftext|>")
    assert dtype == np.uint16
    assert st.eod_id == eod
    assert st.documents == len(DOCS) == len(seqs)
    assert st.tokens == sum(len(s) for s in seqs)
    assert doc_idx.tolist() == list(range(len(DOCS) + 1))
    for text, ids in zip(DOCS, seqs):
        assert ids[-1] == eod
        assert eod not in ids[:-1].tolist() or "<|endoftext|>" in text
        assert tok.decode(ids[:-1].tolist(), skip_special_tokens=False) == text
    assert sorted(os.listdir(tmp_path / "out")) == ["docs_text_document.bin", "docs_text_document.idx"]


def test_plain_files_dirs_and_globs(tmp_path, tokenizer_path, tok):
    d = tmp_path / "txt"
    (d / "sub").mkdir(parents=True)
    files = {"b.txt": DOCS[0], "a.txt": DOCS[2], "sub/c.txt": DOCS[3]}
    for name, text in files.items():
        (d / name).write_text(text, encoding="utf-8")
    gz = tmp_path / "more.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"body": DOCS[1]}) + "\n")
    prefix = str(tmp_path / "plain")
    st = pp.prepare([str(d), str(tmp_path / "*.gz")], prefix, tokenizer_path, json_key="body",
                    append_eod=False)
    _, _, seqs = load_megatron(prefix)
    got = [tok.decode(s.tolist(), skip_special_tokens=False) for s in seqs]
    # a directory is walked in sorted path order, then the next argument
    assert got == [DOCS[2], DOCS[0], DOCS[3], DOCS[1]]
    assert st.files == 4 and st.eod_id == -1


def test_real_fortunes_round_trip(tmp_path, tokenizer_path, tok):
    root = "/usr/share/games/fortunes"
    paths = [os.path.join(root, n) for n in ("goedel", "tao", "linux")]
    paths = [p for p in paths if os.path.isfile(p)]
    if not paths:
        pytest.skip("Debian package fortunes is not installed")
    prefix = str(tmp_path / "fortunes")
    pp.prepare(paths, prefix, tokenizer_path)
    _, _, seqs = load_megatron(prefix)
    assert len(seqs) == len(paths)
    for p, ids in zip(paths, seqs):
        with open(p, encoding="utf-8") as f:
            assert tok.decode(ids[:-1].tolist(), skip_special_tokens=False) == f.read()


def test_megatron_and_numpy_writers_write_identical_bytes(tmp_path, tokenizer_path):
    pytest.importorskip("torch")
    if pp._import_megatron_builder() is None:
        pytest.skip("megatron-core is not installed")
    src = tmp_path / "docs.jsonl"
    write_jsonl(src, DOCS * 3)
    a, b = str(tmp_path / "mcore"), str(tmp_path / "numpy")
    assert pp.prepare([str(src)], a, tokenizer_path, writer="megatron").writer == "megatron"
    assert pp.prepare([str(src)], b, tokenizer_path, writer="numpy").writer == "numpy"
    for ext in (".bin", ".idx"):
        with open(a + ext, "rb") as fa, open(b + ext, "rb") as fb:
            assert fa.read() == fb.read(), ext


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_writers_identical_for_each_token_dtype(tmp_path, dtype):
    if pp._import_megatron_builder() is None:
        pytest.skip("megatron-core is not installed")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    rng = np.random.default_rng(7)
    hi = 65000 if dtype == np.uint16 else 200000
    docs = [rng.integers(0, hi, size=n) for n in (1, 5, 300, 2, 77)]
    for name, cls in (("m", pp.MegatronIndexedWriter), ("n", pp.NumpyIndexedWriter)):
        w = cls(str(tmp_path / f"{name}.bin"), dtype)
        for d in docs:
            w.add_document(d.tolist())
        w.finalize(str(tmp_path / f"{name}.idx"))
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"m{ext}").read_bytes() == (tmp_path / f"n{ext}").read_bytes()
    # megatron-core's own reader sees the documents written by the numpy writer
    ds = IndexedDataset(str(tmp_path / "n"), mmap=True)
    assert len(ds) == len(docs)
    for i, d in enumerate(docs):
        assert ds[i].tolist() == d.tolist()
    info = pp.read_index(str(tmp_path / "n"))
    assert info["dtype"] == np.dtype(dtype)
    assert info["sequence_lengths"].tolist() == [len(d) for d in docs]


def test_malformed_jsonl_names_file_line_and_offset(tmp_path, tokenizer_path):
    lines = [
        json.dumps({"text": "first"}) + "\n",
        json.dumps({"text": "second ü"}, ensure_ascii=False) + "\n",
        '{"text": "broken\n',
        json.dumps({"text": "fourth"}) + "\n",
    ]
    src = tmp_path / "bad.jsonl"
    src.write_bytes("".join(lines).encode("utf-8"))
    offset = len(lines[0].encode()) + len(lines[1].encode())
    prefix = str(tmp_path / "bad")
    with pytest.raises(pp.PrepareError) as e:
        pp.prepare([str(src)], prefix, tokenizer_path)
    msg = str(e.value)
    assert str(src) in msg
    assert "line 3" in msg
    assert f"byte offset {offset}" in msg
    assert not [p for p in os.listdir(tmp_path) if p.startswith("bad.") and p != "bad.jsonl"]


def test_missing_field_and_skip_bad(tmp_path, tokenizer_path):
    src = tmp_path / "mixed.jsonl"
    src.write_text(
        json.dumps({"text": "ok one"}) + "\n"
        + json.dumps({"content": "wrong key"}) + "\n"
        + "not json at all\n"
        + json.dumps({"text": 42}) + "\n"
        + json.dumps({"text": "ok two"}) + "\n",
        encoding="utf-8",
    )
    with pytest.raises(pp.PrepareError, match=r"mixed\.jsonl: line 2 \(byte offset 19\): field 'text' is missing"):
        pp.prepare([str(src)], str(tmp_path / "x"), tokenizer_path)
    st = pp.prepare([str(src)], str(tmp_path / "x"), tokenizer_path, skip_bad=True)
    assert (st.documents, st.skipped) == (2, 3)
    assert "line 4" in st.skip_messages[2]


def test_invalid_utf8_text_file(tmp_path, tokenizer_path):
    src = tmp_path / "latin1.txt"
    src.write_bytes(b"caf\xe9 au lait")
    with pytest.raises(pp.PrepareError, match=r"latin1\.txt: byte offset 3: invalid UTF-8"):
        pp.prepare([str(src)], str(tmp_path / "y"), tokenizer_path)


def test_missing_input_and_missing_eod(tmp_path, tokenizer_path):
    with pytest.raises(pp.PrepareError, match="no such file"):
        pp.prepare([str(tmp_path / "nope*.jsonl")], str(tmp_path / "z"), tokenizer_path)
    src = tmp_path / "a.txt"
    src.write_text("hello")
    with pytest.raises(pp.PrepareError, match="end-of-document"):
        pp.prepare([str(src)], str(tmp_path / "z"), tokenizer_path, eod_token="</s>")


def test_train_tokenizer_special_tokens(tok):
    assert tok.token_to_id("<|endoftext|>") == 0
    assert tok.token_to_id("<pad>") == 1
    assert tok.get_vocab_size() <= 400


def test_cli_via_python_m(tmp_path, tokenizer_path, tok):
    src = tmp_path / "docs.jsonl"
    write_jsonl(src, DOCS[:3])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    prefix = str(tmp_path / "cli")
    cmd = [sys.executable, "-m", "polyload", "prepare", "--input", str(src),
           "--output-prefix", prefix, "--tokenizer", tokenizer_path, "--workers", "1"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "3 documents" in r.stdout
    _, _, seqs = load_megatron(prefix)
    assert [tok.decode(s[:-1].tolist(), skip_special_tokens=False) for s in seqs] == DOCS[:3]

    (tmp_path / "bad.jsonl").write_text('{"text": 1}\n')
    r = subprocess.run(cmd[:5] + [str(tmp_path / "bad.jsonl")] + cmd[6:], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "bad.jsonl: line 1 (byte offset 0)" in r.stderr
    r = subprocess.run(cmd[:4], env=env, capture_output=True, text=True)
    assert r.returncode == 2
