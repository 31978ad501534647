"""Raw text sources with ``tokenizer: {type: tiktoken}``, on the fortunes corpus.

Nothing is downloaded: the ``.tiktoken`` file is made from the corpus' own byte-level BPE
``tokenizer.json`` by ``polyload prepare tiktoken``.

- ids of every document equal tiktoken's own ``encode_ordinary_batch`` (and Hugging Face
  ``tokenizers``' for the tokenizer.json it came from), plus the source's eos;
- a raw tiktoken source gives exactly the batches of the same tokens prepared offline;
- ``encoding:`` takes tiktoken's published pattern and special tokens;
- bad files and settings are clear errors.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import polyload
from polyload import _core
from polyload import _tiktoken
from polyload.prepare import NumpyIndexedWriter

import fortunes_corpus as fc


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    c = dict(fc.build(tmp_path_factory.mktemp("fortunes")))
    out = str(tmp_path_factory.mktemp("tiktoken") / "fortunes.tiktoken")
    r = subprocess.run([sys.executable, "-m", "polyload", "prepare", "tiktoken", "--tokenizer",
                        c["tokenizer"], "--output", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "510 ranks" in r.stdout and "<|endoftext|>=0" in r.stdout
    c["tiktoken"] = out
    return c


def _texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def _tok(corpus, **kw):
    t = {"type": "tiktoken", "path": corpus["tiktoken"], "pat_str": "r50k_base"}
    t.update(kw)
    return {k: v for k, v in t.items() if v is not None}


def _raw_config(corpus, **overrides):
    cfg = fc.config(corpus, tokenizer=_tok(corpus), **overrides)
    cfg["sources"] = [
        {"name": n, "type": "jsonl", "path": os.path.join(corpus["dir"], f"{n}.jsonl"),
         "weight": w, "eos_id": 0}
        for n, w in (("tech", 0.6), ("wit", 0.4))]
    return cfg


_source = fc.open_source


_hashes = fc.batch_hashes


def _encoding(corpus):
    import tiktoken_ext.openai_public as op
    import tiktoken

    ranks = tiktoken.load.load_tiktoken_bpe(corpus["tiktoken"])  # a local path
    return tiktoken.Encoding("fortunes", pat_str=op.r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={})


def test_ids_equal_tiktoken_encode_ordinary_batch(corpus):
    from tokenizers import Tokenizer

    enc = _encoding(corpus)
    hf = Tokenizer.from_file(corpus["tokenizer"])
    cfg = _raw_config(corpus)
    for i, name in enumerate(("tech", "wit")):
        texts = _texts(os.path.join(corpus["dir"], f"{name}.jsonl"))
        src = _source(cfg, i)
        assert src.num_documents == len(texts)
        want = enc.encode_ordinary_batch(texts)
        ref = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
        for d, ids in enumerate(want):
            assert ids == ref[d], (name, d)  # the conversion is exact
            assert np.asarray(src.read(d)).tolist() == ids + [0], (name, d)
        assert src.num_tokenized == len(texts)


def test_batches_equal_prepared_offline(corpus, tmp_path):
    """The same tokens written offline (tiktoken's encode_ordinary_batch, the project's
    Megatron writer) give the same micro-batches as the raw tiktoken source."""
    enc = _encoding(corpus)
    prefixes = {}
    for name in ("tech", "wit"):
        texts = _texts(os.path.join(corpus["dir"], f"{name}.jsonl"))
        prefix = str(tmp_path / f"{name}_tiktoken")
        w = NumpyIndexedWriter(prefix + ".bin", np.uint16)
        for ids in enc.encode_ordinary_batch(texts):
            w.add_document(ids + [0])
        w.finalize(prefix + ".idx")
        prefixes[name] = prefix
    prepared = fc.config(dict(corpus, prefixes=prefixes))
    raw = _raw_config(corpus)
    a, b = _hashes(prepared, 20), _hashes(raw, 20)
    assert len(a) == 2 * 20 * 2 and a == b
    # and not by accident: the hf-prepared corpus is the same tokens, another seed is not
    assert _hashes(fc.config(corpus), 20) == a
    assert _hashes(dict(raw, seed=7), 2) != a[:4]


def test_encoding_takes_the_published_pattern_and_specials(corpus):
    """encoding: cl100k_base: tiktoken's cl100k pattern, and its <|endoftext|> (100257)
    as the eos; the ids are those of that pattern over the file's ranks."""
    enc, eos, n_vocab = _tiktoken.load_encoding(corpus["tiktoken"], encoding="cl100k_base")
    assert eos == 100257 and n_vocab == 100277
    assert enc._pat_str != _encoding(corpus)._pat_str
    cfg = fc.config(corpus)
    cfg["sources"] = [{"name": "tech", "type": "jsonl",
                       "path": os.path.join(corpus["dir"], "tech.jsonl"),
                       "tokenizer": _tok(corpus, pat_str=None, encoding="cl100k_base")}]
    src = _source(cfg, 0)
    texts = _texts(os.path.join(corpus["dir"], "tech.jsonl"))
    want = enc.encode_ordinary_batch(texts)
    for d in range(len(texts)):
        assert np.asarray(src.read(d)).tolist() == want[d] + [100257], d


def test_bad_settings_and_files(corpus, tmp_path):
    def opens(tok, eos_id=None):
        cfg = fc.config(corpus)
        s = {"name": "tech", "type": "jsonl", "tokenizer": tok,
             "path": os.path.join(corpus["dir"], "tech.jsonl")}
        if eos_id is not None:
            s["eos_id"] = eos_id
        cfg["sources"] = [s]
        return _source(cfg, 0)

    with pytest.raises(polyload.ConfigError, match="pat_str applies only to type tiktoken"):
        opens({"type": "hf", "path": corpus["tokenizer"], "pat_str": "x"})
    with pytest.raises(polyload.ConfigError, match="one of them, not both"):
        opens(_tok(corpus, encoding="r50k_base"))
    with pytest.raises(polyload.ConfigError, match="needs one of: 'encoding'"):
        opens({"type": "tiktoken", "path": corpus["tiktoken"]})
    # no end-of-document token without special tokens: the source's eos_id names it
    with pytest.raises(polyload.PolyloadError, match="give eos_id"):
        opens(_tok(corpus))
    # the file is not r50k_base's vocabulary
    with pytest.raises(polyload.PolyloadError, match="does not hold r50k_base's ranks"):
        opens(_tok(corpus, pat_str=None, encoding="r50k_base"))
    with pytest.raises(polyload.PolyloadError, match="unknown tiktoken encoding 'nope'"):
        opens({"type": "tiktoken", "path": corpus["tiktoken"], "encoding": "nope"})
    bad = tmp_path / "bad.tiktoken"
    lines = open(corpus["tiktoken"], "rb").read().splitlines()
    bad.write_bytes(b"\n".join(lines[:5] + [b"!!notbase64 7"] + lines[5:]) + b"\n")
    with pytest.raises(polyload.PolyloadError, match=r"bad.tiktoken: line 6: expected"):
        opens(_tok(corpus, path=str(bad)), eos_id=0)
    bad.write_bytes(b"\n".join(lines[:3] + lines[4:]) + b"\n")  # a single byte missing
    with pytest.raises(polyload.PolyloadError, match="single bytes have no rank"):
        opens(_tok(corpus, path=str(bad)), eos_id=0)
    with pytest.raises(polyload.PolyloadError, match="tiktoken refuses the encoding"):
        opens(_tok(corpus, pat_str="(unclosed"), eos_id=0)



def test_ids_multilingual_gz(corpus, tmp_path):
    """Japanese, German and French manual pages (real UTF-8, from manpages-ja/de/fr) as
    .jsonl.gz: the ids equal encode_ordinary_batch's, with add_eos false."""
    import gzip

    pages = []
    for lang in ("ja", "de", "fr"):
        d = f"/usr/share/man/{lang}/man1"
        for n in sorted(os.listdir(d))[:15]:
            with gzip.open(os.path.join(d, n), "rb") as f:
                pages.append(f.read().decode("utf-8", errors="replace"))
    path = tmp_path / "man.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for p in pages:
            f.write(json.dumps({"body": p}, ensure_ascii=False) + "\n")
    cfg = fc.config(corpus)
    cfg["sources"] = [{"name": "man", "type": "jsonl", "path": str(path), "text_key": "body",
                       "tokenizer": _tok(corpus, add_eos=False)}]
    src = _source(cfg, 0)
    assert src.num_documents == len(pages)
    for d, ids in enumerate(_encoding(corpus).encode_ordinary_batch(pages)):
        assert np.asarray(src.read(d)).tolist() == ids, d
