"""Raw text sources tokenized online, on real text from Debian packages.

- token ids of every document equal Hugging Face ``tokenizers``' own (fortunes, and
  German/French/Japanese manual pages from manpages-de/fr/ja);
- a jsonl source gives exactly the batches of the same text prepared offline with
  ``polyload prepare`` and the same tokenizer (hashes of every micro-batch of both ranks);
- resume continues exactly; bad records are skipped and counted the same on every rank;
- each document is tokenized once.
"""

import gzip
import json
import os
import time

import numpy as np
import pytest
import yaml

import polyload
from polyload import _core

import fortunes_corpus as fc

MAN_JA = "/usr/share/man/ja/man1"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return fc.build(tmp_path_factory.mktemp("fortunes"))


def _raw_config(corpus, **overrides):
    cfg = fc.config(corpus, tokenizer={"type": "hf", "path": corpus["tokenizer"]}, **overrides)
    cfg["sources"] = [
        {"name": "tech", "type": "jsonl", "path": os.path.join(corpus["dir"], "tech.jsonl"),
         "weight": 0.6},
        {"name": "wit", "type": "jsonl", "path": os.path.join(corpus["dir"], "wit.jsonl"),
         "weight": 0.4},
    ]
    return cfg


_hashes = fc.batch_hashes


def _texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


_source = fc.open_source


def test_token_ids_equal_tokenizers(corpus):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(corpus["tokenizer"])
    eod = tok.token_to_id("<|endoftext|>")
    cfg = _raw_config(corpus)
    for i, name in enumerate(("tech", "wit")):
        texts = _texts(os.path.join(corpus["dir"], f"{name}.jsonl"))
        src = _source(cfg, i)
        assert src.type == "jsonl" and src.num_documents == len(texts)
        want = tok.encode_batch(texts, add_special_tokens=False)
        for d, enc in enumerate(want):
            got = np.asarray(src.read(d))
            assert got.tolist() == enc.ids + [eod], (name, d)
        assert src.num_tokenized == len(texts)  # each document once
        # tokenizing was timed in C on the threads that did it: some CPU, at most the
        # process's
        assert 0.0 < src.tokenize_cpu_s <= time.process_time()


def test_token_ids_multilingual_gz(corpus, tmp_path):
    """Japanese, German and French manual pages (roff source, real UTF-8), as .jsonl.gz."""
    from tokenizers import Tokenizer

    pages = []
    for lang in ("ja", "de", "fr"):
        d = f"/usr/share/man/{lang}/man1"
        names = sorted(os.listdir(d))[:15]
        for n in names:
            with gzip.open(os.path.join(d, n), "rb") as f:
                pages.append(f.read().decode("utf-8", errors="replace"))
    path = tmp_path / "man.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for p in pages:
            f.write(json.dumps({"body": p}, ensure_ascii=False) + "\n")
    tok = Tokenizer.from_file(corpus["tokenizer"])
    cfg = fc.config(corpus)
    cfg["sources"] = [{"name": "man", "type": "jsonl", "path": str(path), "text_key": "body",
                       "tokenizer": {"type": "hf", "path": corpus["tokenizer"],
                                     "add_eos": False}}]
    src = _source(cfg, 0)
    assert src.num_documents == len(pages)
    for d, enc in enumerate(tok.encode_batch(pages, add_special_tokens=False)):
        assert np.asarray(src.read(d)).tolist() == enc.ids


def test_batches_equal_prepared(corpus):
    """The raw text and the same text prepared offline give the same micro-batches."""
    prepared = _hashes(fc.config(corpus), 30)
    raw = _hashes(_raw_config(corpus), 30)
    assert len(raw) == 2 * 30 * 2 and raw == prepared
    # and not by accident: another seed gives other batches
    assert _hashes(_raw_config(corpus, seed=99), 3) != raw[:6]


def test_threads_do_not_change_batches(corpus):
    cfg = _raw_config(corpus)
    for s in cfg["sources"]:
        s["tokenizer"] = {"type": "hf", "path": corpus["tokenizer"], "threads": 3}
        s["lookahead"] = 7
    assert _hashes(cfg, 10) == _hashes(_raw_config(corpus), 10)


def test_tokenize_pool_and_shared_tokenizer_do_not_change_batches(corpus, tmp_path):
    """A process-wide tokenize pool (what the Ray source loaders use), with two tokenizer
    threads per source handing it their batches, gives the same
    micro-batches; sources naming one tokenizer file share one loaded tokenizer, a copy
    of the file is loaded apart; a released tokenizer loads again with the same ids."""
    want = _hashes(_raw_config(corpus), 10)
    assert _core.tokenize_threads() == 0
    _core.set_tokenize_threads(1)
    try:
        assert _core.tokenize_threads() == 1
        for s in ("tech", "wit"):  # no length cache: every length is tokenized
            side = os.path.join(corpus["dir"], s + ".jsonl.pllen")
            if os.path.exists(side):
                os.remove(side)
        cfg = _raw_config(corpus)
        for s in cfg["sources"]:
            s["tokenizer"] = {"type": "hf", "path": corpus["tokenizer"], "threads": 2}
        assert _hashes(cfg, 10) == want
    finally:
        _core.set_tokenize_threads(0)
    with pytest.raises(polyload.PolyloadError):
        _core.set_tokenize_threads(257)
    cfg = _raw_config(corpus, sidecar_index="memory")
    copy = tmp_path / "copy.json"
    copy.write_bytes(open(corpus["tokenizer"], "rb").read())
    cfg["sources"].append(dict(cfg["sources"][1], name="wit2",
                               tokenizer={"type": "hf", "path": str(copy)}))
    c = _core.Config.parse_string(json.dumps(cfg))
    tech, wit, wit2 = (c.open_source(i) for i in range(3))
    assert tech.tokenizer_state() == {"loaded": True, "loads": 1, "shared_by": 2}
    assert wit2.tokenizer_state() == {"loaded": True, "loads": 1, "shared_by": 1}
    ref = wit2.lengths(list(range(20)))
    wit2.release_tokenizer()
    assert wit2.tokenizer_state() == {"loaded": False, "loads": 1, "shared_by": 0}
    lens = wit.lengths(list(range(30)))  # the shared one: the same lengths
    assert lens[:20] == ref
    # a document wit2 has not tokenized: it loads its tokenizer again, same tokens
    assert wit2.read_many(np.asarray([[2, 25, 0, lens[25]]], np.int64)).tolist() == \
        wit.read_many(np.asarray([[1, 25, 0, lens[25]]], np.int64)).tolist()
    assert wit2.tokenizer_state() == {"loaded": True, "loads": 2, "shared_by": 1}


def test_resume(corpus):
    cfg = dict(_raw_config(corpus), train_steps=12)
    with polyload.Loader(cfg, rank=0) as a:
        it = iter(a)
        for _ in range(10):
            next(it)
        state = a.state_dict()
        rest = [next(it)["input_ids"].numpy().copy() for _ in range(6)]
    with polyload.Loader(cfg, rank=0) as b:
        b.load_state_dict(state)
        it = iter(b)
        again = [next(it)["input_ids"].numpy().copy() for _ in range(6)]
    assert all((x == y).all() for x, y in zip(rest, again))
    assert len(state["blob"]) < 2048  # O(1) in the documents consumed


def test_bad_records_skipped_same_on_every_rank(corpus, tmp_path):
    texts = _texts(os.path.join(corpus["dir"], "tech.jsonl"))
    path = tmp_path / "mixed.jsonl"
    bad = 0
    with open(path, "wb") as f:
        for i, t in enumerate(texts):
            if i % 40 == 1:
                f.write(b'{"text": 12}\n')
                bad += 1
            elif i % 40 == 2:
                f.write(b'{"text": "broken\n')
                bad += 1
            elif i % 40 == 3:
                f.write(b'{"text": "bad \xff utf-8"}\n')
                bad += 1
            else:
                f.write(json.dumps({"text": t}).encode() + b"\n")
    cfg = _raw_config(corpus, train_steps=60)
    cfg["sources"] = [{"name": "tech", "type": "jsonl", "path": str(path), "weight": 1.0}]
    with pytest.raises(polyload.PolyloadError, match=r"mixed.jsonl: line \d+ \(byte offset \d+\)"):
        with polyload.Loader(cfg, rank=0) as loader:
            for _ in loader:
                pass
    cfg["on_error"] = "skip"
    skipped = []
    for rank in range(2):
        with polyload.Loader(cfg, rank=rank) as loader:
            for _ in loader:
                pass
            skipped.append(loader.stats()["skipped"])
    assert skipped[0] == skipped[1] and skipped[0] > 0


def test_sentencepiece_ids_equal_the_library(corpus, tmp_path):
    """type: sentencepiece runs in C++ (libsentencepiece, Debian) inside the C library;
    its ids equal the sentencepiece Python package's (the same library) for every
    document, with a model trained on the fortunes at test time."""
    import sentencepiece as spm  # PY_PACKAGES installs it
    texts = _texts(os.path.join(corpus["dir"], "tech.jsonl"))
    train = tmp_path / "train.txt"
    train.write_text("\n".join(t.replace("\n", " ") for t in texts), encoding="utf-8")
    prefix = str(tmp_path / "spm")
    # BPE: libsentencepiece 0.1.97 (Debian 12, linked by the C library) and the PyPI
    # package 0.2.x give the same ids; for unigram models they break ties in digit runs
    # differently (12 of these 1,387 fortunes), a difference between the library versions.
    spm.SentencePieceTrainer.train(input=str(train), model_prefix=prefix, vocab_size=400,
                                   model_type="bpe", minloglevel=2, num_threads=1)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    cfg = fc.config(corpus)
    cfg["sources"] = [{"name": "tech", "type": "jsonl",
                       "path": os.path.join(corpus["dir"], "tech.jsonl"),
                       "tokenizer": {"type": "sentencepiece", "path": prefix + ".model"}}]
    src = _source(cfg, 0)
    want = sp.encode(texts)
    eos = sp.eos_id()
    assert eos >= 0
    for d, ids in enumerate(want):
        assert np.asarray(src.read(d)).tolist() == ids + [eos], d
    # and a loader runs on it
    cfg["train_steps"] = 3
    assert len(_hashes(cfg, 3)) == 2 * 3 * 2


def _sft_file(corpus, path):
    """Instruction records from the fortunes: the first line is the prompt, the rest the
    response (one-line fortunes: an empty prompt)."""
    recs = []
    for t in _texts(os.path.join(corpus["dir"], "wit.jsonl"))[:300]:
        head, _, tail = t.partition("\n")
        recs.append({"q": head + "\n", "a": tail} if tail.strip() else {"q": "", "a": t})
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return recs


def test_instruction_data_masks_the_prompt(corpus, tmp_path):
    """prompt_key/response_key: a document is the prompt's ids, the response's, then eos
    (each part tokenized by ``tokenizers`` alone); labels and loss_mask leave out every
    label that is a prompt token; the source reads the plain ids."""
    from tokenizers import Tokenizer

    path = str(tmp_path / "sft.jsonl")
    recs = _sft_file(corpus, path)
    tok = Tokenizer.from_file(corpus["tokenizer"])
    eos = tok.token_to_id("<|endoftext|>")
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids if s else []  # noqa: E731
    want = [(enc(r["q"]), enc(r["a"])) for r in recs]
    src_cfg = {"name": "sft", "type": "jsonl", "path": path, "prompt_key": "q",
               "response_key": "a", "weight": 1.0}
    cfg = _raw_config(corpus, train_steps=12, seq_length=256, topology={"dp": 1})
    cfg["sources"] = [src_cfg]
    src = _core.Config.parse_string(yaml.safe_dump(cfg), origin="t").open_source(0)
    for d in (0, 1, 7, 150):
        q, a = want[d]
        assert np.asarray(src.read(d)).tolist() == q + a + [eos], d
    by_ids = {tuple(q + a + [eos]): len(q) for q, a in want}
    seen = masked = 0
    with polyload.Loader(cfg, rank=0) as loader:
        for b in loader:
            ids, lab = b["input_ids"].numpy().ravel(), b["labels"].numpy().ravel()
            mask, cu = b["loss_mask"].numpy().ravel(), b["cu_seqlens"].numpy()
            for s0, s1 in zip(cu[:-1], cu[1:]):
                seg = tuple(ids[s0:s1].tolist())
                if seg not in by_ids:  # padding, or a piece of a split document
                    continue
                plen, n = by_ids[seg], s1 - s0
                want_mask = [1.0 if t + 1 >= plen else 0.0 for t in range(n - 1)] + [0.0]
                assert mask[s0:s1].tolist() == want_mask
                want_lab = [ids[s0 + t + 1] if want_mask[t] else -100 for t in range(n)]
                assert lab[s0:s1].tolist() == want_lab
                seen += 1
                masked += max(plen - 1, 0)
    assert seen > 20 and masked > 100


def test_chat_messages_train_on_assistant_turns(corpus, tmp_path):
    """messages_key with chat_template chatml: the ids are those of ``tokenizers`` for
    each template piece and content, joined; trained on are the assistant's content and
    its end-of-turn text (and the eos after it)."""
    from tokenizers import Tokenizer

    texts = _texts(os.path.join(corpus["dir"], "wit.jsonl"))[:120]
    path = str(tmp_path / "chat.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for i in range(0, len(texts) - 1, 2):
            msgs = [{"role": "user", "content": texts[i]},
                    {"role": "assistant", "content": texts[i + 1]}]
            f.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
    tok = Tokenizer.from_file(corpus["tokenizer"])
    eos = tok.token_to_id("<|endoftext|>")
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    cfg = _raw_config(corpus, train_steps=4, seq_length=512, topology={"dp": 1})
    cfg["sources"] = [{"name": "chat", "type": "jsonl", "path": path,
                       "messages_key": "messages", "chat_template": "chatml", "weight": 1.0}]
    src = _core.Config.parse_string(yaml.safe_dump(cfg), origin="t").open_source(0)
    for d in (0, 5, 30):
        u, a = texts[2 * d], texts[2 * d + 1]
        pieces = [("<|im_start|>user\n", 0), (u, 0), ("<|im_end|>\n", 0),
                  ("<|im_start|>assistant\n", 0), (a, 1), ("<|im_end|>\n", 1)]
        ids, train = [], []
        for text, t in pieces:
            e = enc(text)
            ids += e
            train += [t] * len(e)
        ids.append(eos)
        train.append(1)
        assert np.asarray(src.read(d)).tolist() == ids, d
        marked = np.asarray(src.read_many(np.array([[0, d, 0, len(ids)]], dtype=np.int64)))
        assert marked.tolist() == [x if t else -1 - x for x, t in zip(ids, train)], d
