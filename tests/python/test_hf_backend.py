"""The library behind ``tokenizer: {type: hf}``: fastokens where it gives ``tokenizers``'
ids for the file, ``tokenizers`` elsewhere (polyload._hfbackend), on real text.

- ``backend: auto`` picks fastokens for a byte-level BPE file; the ids of every document
  and the micro-batches equal those of ``backend: tokenizers`` and of ``tokenizers`` itself;
- a file fastokens cannot encode (a SentencePiece-style Metaspace file) falls back to
  ``tokenizers`` with one warning naming the file and the reason, and gives ``tokenizers``'
  ids; ``backend: fastokens`` on it is a config error naming the file;
- a file fastokens loads but reads otherwise (a split regex its regex engine reads
  differently) is caught by the load-time check and falls back;
- ``backend`` values are checked, and apply to type hf only.
"""

import json
import logging
import os

import numpy as np
import pytest

import polyload
from polyload import _hfbackend

import fortunes_corpus as fc

import fastokens  # noqa: F401,E402 - a dependency of the package: missing is a failure


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return fc.build(tmp_path_factory.mktemp("fortunes_hfb"))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Each test checks files anew: a cache of its own, and no verdicts in memory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(_hfbackend, "_checked", {})
    monkeypatch.setattr(_hfbackend, "_logged", set())


def _texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def _cfg(corpus, tokpath, backend=None):
    tok = {"type": "hf", "path": tokpath}
    if backend:
        tok["backend"] = backend
    cfg = fc.config(corpus, tokenizer=tok)
    cfg["sources"] = [
        {"name": "tech", "type": "jsonl", "path": os.path.join(corpus["dir"], "tech.jsonl"),
         "weight": 0.6},
        {"name": "wit", "type": "jsonl", "path": os.path.join(corpus["dir"], "wit.jsonl"),
         "weight": 0.4},
    ]
    return cfg


def _ids(cfg, i):
    src = fc.open_source(cfg, i)
    return [np.asarray(src.read(d)).tolist() for d in range(src.num_documents)]


def test_auto_picks_fastokens_with_the_same_ids(corpus, caplog):
    from tokenizers import Tokenizer

    path = corpus["tokenizer"]
    with caplog.at_level(logging.WARNING, logger="polyload"):
        lib, _ = _hfbackend.load(path)
    assert lib == "fastokens" and not caplog.records
    tok = Tokenizer.from_file(path)
    eod = tok.token_to_id("<|endoftext|>")
    for i, name in enumerate(("tech", "wit")):
        texts = _texts(os.path.join(corpus["dir"], f"{name}.jsonl"))
        want = [e.ids + [eod] for e in tok.encode_batch(texts, add_special_tokens=False)]
        assert _ids(_cfg(corpus, path), i) == want, name
        assert _ids(_cfg(corpus, path, "fastokens"), i) == want, name
        assert _ids(_cfg(corpus, path, "tokenizers"), i) == want, name
    a = fc.batch_hashes(_cfg(corpus, path), 12)
    assert a == fc.batch_hashes(_cfg(corpus, path, "tokenizers"), 12)
    assert a == fc.batch_hashes(fc.config(corpus), 12)  # the text prepared offline
    # the verdict is kept on disk for other processes
    cache = os.path.join(os.environ["XDG_CACHE_HOME"], "polyload", "hf_backend.json")
    with open(cache) as f:
        assert list(json.load(f).values()) == [{"reason": None}]


def _metaspace_tokenizer(corpus, out):
    """A SentencePiece-style file (Metaspace pre-tokenizer, byte fallback) trained by
    ``tokenizers`` on the corpus: what the converted Llama 2 / Mistral files are."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<|endoftext|>"],
                             initial_alphabet=[f"<0x{b:02X}>" for b in range(256)])
    tok.train([os.path.join(corpus["dir"], "tech.jsonl")], tr)
    tok.save(out)
    return out


def test_metaspace_falls_back_to_tokenizers_once(corpus, tmp_path, caplog):
    from tokenizers import Tokenizer

    path = _metaspace_tokenizer(corpus, str(tmp_path / "spm_style.json"))
    with caplog.at_level(logging.WARNING, logger="polyload"):
        ids = _ids(_cfg(corpus, path), 1)
        _ids(_cfg(corpus, path), 0)  # the same file again: no second message
    msgs = [r.getMessage() for r in caplog.records if r.name == "polyload"]
    assert len(msgs) == 1, msgs
    assert path in msgs[0] and "tokenizing with tokenizers" in msgs[0]
    assert "Metaspace" in msgs[0]
    tok = Tokenizer.from_file(path)
    eod = tok.token_to_id("<|endoftext|>")
    texts = _texts(os.path.join(corpus["dir"], "wit.jsonl"))
    assert ids == [e.ids + [eod] for e in tok.encode_batch(texts, add_special_tokens=False)]
    with pytest.raises(polyload.PolyloadError) as e:
        _ids(_cfg(corpus, path, "fastokens"), 0)
    assert path in str(e.value) and "Metaspace" in str(e.value)


def test_a_regex_read_otherwise_is_caught(corpus, tmp_path, caplog):
    """cl100k's own pattern (possessive quantifiers, ``\\s++$``) in a tokenizer.json:
    the two regex engines part on whitespace before a line end, which the probes hold."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    pattern = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"""
               r""" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
    from tokenizers import models, trainers

    # onig reads \p{N}{1,3}+ as repeated runs of up to 3 digits (so "1905" is one piece),
    # PCRE2 as a possessive run of at most 3 ("190", "5"): a vocabulary that learned
    # years as tokens tells them apart
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    texts = _texts(os.path.join(corpus["dir"], "wit.jsonl"))
    years = [" ".join(str(y) for y in range(1880, 2040))] * 50
    tok.train_from_iterator(texts + years, trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = str(tmp_path / "possessive.json")
    tok.save(path)
    reason = _hfbackend._check(path, __import__("fastokens").Tokenizer.from_file(path),
                               _hfbackend._probe_texts(path))
    assert reason is not None and "other ids" in reason
    with caplog.at_level(logging.WARNING, logger="polyload"):
        lib, t = _hfbackend.load(path)
    assert lib == "tokenizers" and isinstance(t, Tokenizer)
    assert any("probe text" in r.getMessage() for r in caplog.records)


def test_backend_values(corpus):
    path = corpus["tokenizer"]
    bad = _cfg(corpus, path, "nope")
    with pytest.raises(polyload.ConfigError, match="backend: unknown value 'nope'"):
        fc.open_source(bad, 0)
    cfg = _cfg(corpus, path)
    cfg["sources"][0]["tokenizer"] = {"type": "bytes", "backend": "tokenizers"}
    with pytest.raises(polyload.ConfigError, match="backend applies only to type hf"):
        fc.open_source(cfg, 0)
    with pytest.raises(ValueError, match="not one of auto, fastokens, tokenizers"):
        _hfbackend.load(path, "other")
    assert _hfbackend.load(path, "tokenizers")[0] == "tokenizers"
    assert _hfbackend.load(path, "auto")[0] == "fastokens"
