#!/usr/bin/env python3
"""Which tokenizer library gives Hugging Face `tokenizers`' ids, and how fast.

For every candidate library that is installed, and for each tokenizer file of a set
of real models' tokenizers (built from files that PyPI packages ship, see
`tokenizer_files`), every document of the demo corpus (data/raw/*.jsonl, made by
scripts/build_corpus.py) and of a hostile set (`hostile_documents`) is encoded by the
candidate and by `tokenizers.Tokenizer.encode_batch(texts, add_special_tokens=False)`
(what a raw text source with `tokenizer: {type: hf}` asks for: the tokenizer's added
tokens are matched inside the text, no post-processor tokens are added).

Reported per library and tokenizer file:
  * documents whose ids differ from `tokenizers`' (an error on both sides counts as
    the same; an error on one side only as a difference), with the first few named;
  * tokens/s on one core: the demo corpus text in batches of 64 documents through the
    library's fastest batch call, its output as it comes (fastokens: encode_batch_flat's
    flat buffer; gigatoken: encode_batch's awkward Array; tokenizers: Encoding objects;
    kitoken, tiktoken, bpe-openai: lists), a warm-up pass first, one thread,
    the library's own thread pool held to one thread (RAYON_NUM_THREADS=1), the process
    pinned to one CPU; median and range over paired, interleaved rounds;
  * scaling to all cores: two (or N) Python threads calling the library's batch call
    at once, over one thread's rate, in the same rounds; near 1.0 means the call holds
    the GIL;
  * whether the package exports a C ABI (symbols other than PyInit_* in its
    extension module).

The tiktoken-style candidates (tiktoken, bpe-openai) are checked on the files made
from cl100k_base / o200k_base ranks, with `encode_ordinary` (no special tokens).

    .venv/bin/python bench/text/tokenizer_parity.py                 # all
    .venv/bin/python bench/text/tokenizer_parity.py --rounds 3 --no-big

Writes bench/results/raw/tokenizer_parity.json (records: figure, value, unit, command,
machine, date) and prints a table.
"""
import argparse
import glob
import gzip
import io
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time
import zipfile

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")  # fastokens' own worker threads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.join(ROOT, "bench", "out", "tokenizers")
RESULTS = os.path.join(ROOT, "bench", "results", "raw")  # per-round data; tokenizer.json holds the figures of record

O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""", r"""\s+"""])
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
                  r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s""")


# ------------------------------------------------------------------ tokenizer files

def _spm_to_json(model_path, out):
    """A SentencePiece model as a tokenizer.json, by transformers' own converter
    (the file a `*TokenizerFast` of that model saves)."""
    from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf
    pb = import_protobuf()
    proto = pb.ModelProto()
    with open(model_path, "rb") as f:
        proto.ParseFromString(f.read())
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}  # a dict: a BPE model, as hub files
    SpmConverter.build_tokenizer_from_spm_proto(proto, vocab).save(out)


def _tiktoken_to_json(ranks_path, pattern, out):
    """.tiktoken ranks as a byte-level BPE tokenizer.json (transformers'
    TikTokenConverter, as for Llama 3 and other tiktoken-trained models)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter
    c = TikTokenConverter(vocab_file=ranks_path, pattern=pattern,
                          extra_special_tokens={"<|endoftext|>": 0})
    c.converted().save(out)


def tokenizer_files(with_claude=True):
    """[(name, tokenizer.json path, origin, tiktoken (ranks path, pattern) or None)]."""
    os.makedirs(CACHE, exist_ok=True)
    out = []
    demo = os.path.join(ROOT, "data", "tokenizer.json")
    if os.path.exists(demo):
        out.append(("demo_bpe32k", demo, "data/tokenizer.json (scripts/build_corpus.py)", None))
    try:
        import mistral_common
        md = os.path.join(os.path.dirname(mistral_common.__file__), "data")
        for name, fn in (("mistral_v1_spm", "tokenizer.model.v1"),
                         ("mistral_v3_spm", "mistral_instruct_tokenizer_240323.model.v3")):
            p = os.path.join(CACHE, name + ".json")
            if not os.path.exists(p):
                _spm_to_json(os.path.join(md, fn), p)
            out.append((name, p, f"mistral-common {mistral_common.__version__} data/{fn}, "
                        "converted by transformers' SpmConverter", None))
    except ImportError:
        print("mistral-common not installed: no Mistral tokenizers", file=sys.stderr)
    try:
        import bpe_openai
        bd = os.path.join(os.path.dirname(bpe_openai.__file__), "data")
        # cl100k ranks with the pattern transformers writes for them (Llama 3's tokenizer.json);
        # o200k with its own.
        for enc, pat in (("cl100k_base", LLAMA3_PATTERN), ("o200k_base", O200K_PATTERN)):
            ranks = os.path.join(CACHE, enc + ".tiktoken")
            if not os.path.exists(ranks):
                with gzip.open(os.path.join(bd, enc + ".tiktoken.gz")) as f, open(ranks, "wb") as g:
                    g.write(f.read())
            p = os.path.join(CACHE, enc + ".json")
            if not os.path.exists(p):
                _tiktoken_to_json(ranks, pat, p)
            out.append((enc, p, f"bpe-openai data/{enc}.tiktoken.gz, converted by "
                        "transformers' TikTokenConverter",
                        (enc, ranks, CL100K_PATTERN if enc == "cl100k_base" else pat)))
    except ImportError:
        print("bpe-openai not installed: no cl100k/o200k files", file=sys.stderr)
    if with_claude:
        # The anthropic SDK shipped its tokenizer.json up to 0.38: a byte-level BPE
        # with an NFKC normalizer.
        p = os.path.join(CACHE, "claude_anthropic.json")
        if not os.path.exists(p):
            d = os.path.join(CACHE, "dl")
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--only-binary=:all:", "anthropic==0.34.0", "-d", d], check=False)
            whl = glob.glob(os.path.join(d, "anthropic-0.34.0-*.whl"))
            if whl:
                with zipfile.ZipFile(whl[0]) as z, open(p, "wb") as g:
                    g.write(z.read("anthropic/tokenizer.json"))
        if os.path.exists(p):
            out.append(("claude_anthropic", p, "anthropic 0.34.0 wheel, anthropic/tokenizer.json", None))
    return out


# ------------------------------------------------------------------ documents

def corpus_documents(limit_bytes=None):
    """[(name, text)] of the demo corpus (data/raw/*.jsonl), in file order."""
    docs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "data", "raw", "*.jsonl"))):
        base = os.path.basename(path)
        total = 0
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                t = json.loads(line)["text"]
                docs.append((f"{base}:{i + 1}", t))
                total += len(t)
                if limit_bytes and total >= limit_bytes:
                    break
    return docs


def hostile_documents(added_tokens, corpus, big=True):
    """[(name, text, json_line)]: texts built to break tokenizers.  Each comes as the
    JSON line a jsonl source would hold; the text is json.loads of that line (so the
    escaped lone surrogates arrive as Python's surrogate code points, which a
    jsonl source refuses as a bad record and the libraries must refuse too)."""
    rng = random.Random(7)
    scripts = ["Hello world", "Привет мир", "Γειά σου κόσμε", "مرحبا بالعالم", "שלום עולם",
               "नमस्ते दुनिया", "สวัสดีชาวโลก", "你好，世界", "안녕하세요 세계", "こんにちは世界",
               "ሰላም ልዑል", "Xin chào thế giới", "გამარჯობა", "Բարեւ աշխարհ", "ᚠᛇᚻ᛫ᛒᛦᚦ"]
    emoji = ["🙂", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪", "1️⃣", "❤️", "🧑🏿‍🚀", "😀😃😄", "\u2764\ufe0f"]
    comb = ["e\u0301", "a\u0300\u0316", "n\u0303", "\u1100\u1161\u11a8", "o\u0308\u0304",
            "Z" + "".join(chr(0x300 + (i % 0x6f)) for i in range(60)), "\u0915\u094d\u0937"]
    texts = []

    def add(name, text=None, raw=None):
        line = raw if raw is not None else json.dumps({"text": text})
        texts.append((name, json.loads(line)["text"], line))

    for i in range(40):
        k = rng.randint(3, 30)
        parts = [rng.choice(scripts + emoji + comb + [" ", "\n", "\t", "  "]) for _ in range(k)]
        add(f"mixed_scripts_{i}", "".join(parts))
    add("all_scripts", " ".join(scripts))
    add("emoji_zwj", " ".join(emoji) + "".join(emoji))
    add("combining_zalgo", "".join(comb) * 5)
    add("nfd_vs_nfc", "Cafe\u0301 café ﬁ ﬀ Ⅻ ① ｆｕｌｌ ＷＩＤＴＨ ㈱ ㌀")
    add("ws_spaces_10k", " " * 10000)
    add("ws_mixed", ("\t \n\r\n \u00a0\u3000\u2028\u2029\u200b\ufeff" * 500))
    add("ws_newlines", "a" + "\n" * 5000 + "b" + "\r\n" * 3000)
    add("ws_trailing", "text followed by spaces" + " " * 777)
    add("digits_100k", "".join(rng.choice("0123456789") for _ in range(100000)))
    add("digits_grouped", " ".join(f"{rng.randint(0, 10**12):,}" for _ in range(2000)))
    add("digits_other", "٠١٢٣٤٥٦٧٨٩ ０１２３４５６７８９ ⁰¹²³ ½ ¾ ⅔ 𝟘𝟙𝟚" * 50)
    add("long_word", "x" * 200000)
    add("long_token_run", "abc" * 50000)
    add("punct_run", "!?.,;:-_=+*/\\|#@$%^&(){}[]<>~`'\"" * 3000)
    # escapes in JSON: valid pairs, lone and reversed surrogates, noncharacters, NUL
    add("escaped_pair", raw='{"text": "smile \\ud83d\\ude00 ok"}')
    add("lone_high_surrogate", raw='{"text": "abc \\ud800 def"}')
    add("lone_low_surrogate", raw='{"text": "abc \\udc00 def"}')
    add("reversed_surrogates", raw='{"text": "x\\udc00\\ud800y"}')
    add("noncharacters", raw='{"text": "a\\ufffe b\\uffff c\\ufdd0 \\u0000 \\u0001 \\u007f"}')
    add("replacement_char", "bad bytes became \ufffd\ufffd here")
    add("private_use", "\ue000\uf8ff\U000f0000\U0010fffd")
    add("astral", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 𓀀 🀄 𝄞" * 20)
    # special tokens of the file inside text, whole, run together, and broken
    for j, tok in enumerate(added_tokens[:30]):
        add(f"special_{j}", f"before {tok} after{tok}{tok} {tok[:-1]} {tok[1:]} "
                            f"x{tok.upper()}y")
    add("special_lookalikes", "<|endoftext|> <|endoftext|><|endoftext|> <s></s> [INST] [/INST] "
                              "<unk> <pad> <|im_start|> <|begin_of_text|> < s > <|endof text|>")
    add("empty", "")
    add("one_space", " ")
    add("one_newline", "\n")
    if big:
        # 10 MB documents: corpus text run together, and one of random scripts
        buf, n = [], 0
        for _, t in corpus:
            buf.append(t)
            n += len(t.encode())
            if n >= 10 << 20:
                break
        big_text = "\n".join(buf)
        while len(big_text.encode()) < 10 << 20:
            big_text += big_text
        big_text = big_text.encode()[:10 << 20].decode("utf-8", "ignore")
        add("big_10mb_corpus", big_text)
        parts, n = [], 0
        while n < 10 << 20:
            p = rng.choice(scripts + emoji + comb + [" ", "\n", "1234", "  \t"])
            parts.append(p)
            n += len(p.encode())
        add("big_10mb_mixed", "".join(parts))
    return texts


# ------------------------------------------------------------------ candidates

class Candidate:
    """A library under test: load(path) -> handle, encode(handle, texts) -> [[ids]]."""
    name = ""
    module = ""
    tiktoken_style = False

    def available(self):
        try:
            __import__(self.module)
            return True
        except ImportError:
            return False

    def version(self):
        from importlib import metadata
        try:
            return metadata.version(self.dist)
        except Exception:
            return "?"

    def encode_native(self, h, texts):
        """The library's fastest batch call, its output left as it comes (what a loader
        reads ids from): the speed runs time this, not the lists `encode` builds."""
        return self.encode(h, texts)

    def count(self, out):
        return sum(len(x) for x in out)

    def c_abi(self):
        """Exported symbols of the package's extension modules other than PyInit_*."""
        mod = __import__(self.module)
        d = os.path.dirname(mod.__file__)
        syms = []
        for so in glob.glob(os.path.join(d, "**", "*.so"), recursive=True):
            p = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True)
            for line in p.stdout.splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[1] in "TW" and not parts[2].startswith(("PyInit_", "_")):
                    syms.append(parts[2])
        return syms


class HF(Candidate):
    name, module, dist = "tokenizers", "tokenizers", "tokenizers"

    def load(self, path, tk=None):
        import tokenizers
        return tokenizers.Tokenizer.from_file(path)

    def encode(self, h, texts):
        return [e.ids for e in h.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_native(self, h, texts):
        return h.encode_batch_fast(texts, add_special_tokens=False)


class Fastokens(Candidate):
    name, module, dist = "fastokens", "fastokens", "fastokens"

    def load(self, path, tk=None):
        import fastokens
        return fastokens.Tokenizer.from_file(path)

    def encode(self, h, texts):
        import numpy as np
        ids, off = h.encode_batch_flat(texts, add_special_tokens=False)
        ids = np.frombuffer(ids, np.uint32)
        off = np.frombuffer(off, np.uint64)
        return [ids[off[i]:off[i + 1]].tolist() for i in range(len(texts))]

    def encode_native(self, h, texts):
        return h.encode_batch_flat(texts, add_special_tokens=False)

    def count(self, out):
        return len(out[0]) // 4


class Tokie(Candidate):
    name, module, dist = "tokie", "tokie", "tokie"

    def load(self, path, tk=None):
        import tokie
        return tokie.Tokenizer.from_json(path)

    def encode(self, h, texts):
        return [list(e.ids) for e in h.encode_batch(texts, add_special_tokens=False)]

    def encode_native(self, h, texts):
        return h.encode_batch(texts, add_special_tokens=False)


class Gigatoken(Candidate):
    name, module, dist = "gigatoken", "gigatoken", "gigatoken"

    def load(self, path, tk=None):
        import gigatoken
        return gigatoken.Tokenizer(path)

    def encode(self, h, texts):
        return [list(x) for x in h.encode_batch_list(texts, parallel=False)]

    def encode_native(self, h, texts):
        return h.encode_batch(texts, parallel=False)  # an awkward Array: one flat buffer

    def count(self, out):
        return len(out.layout.content.data)


class Kitoken(Candidate):
    name, module, dist = "kitoken", "kitoken", "kitoken"

    def load(self, path, tk=None):
        import kitoken
        return kitoken.Kitoken.from_tokenizers_file(path)

    def encode(self, h, texts):
        return h.encode_all(texts, True)


class Tiktoken(Candidate):
    name, module, dist = "tiktoken", "tiktoken", "tiktoken"
    tiktoken_style = True

    def load(self, path, tk=None):
        if tk is None:
            raise NotImplementedError("reads .tiktoken ranks, not a tokenizer.json")
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
        enc, ranks, pat = tk
        return tiktoken.Encoding(enc + "_local", pat_str=pat, mergeable_ranks=load_tiktoken_bpe(ranks),
                                 special_tokens={})

    def encode(self, h, texts):
        return [h.encode_ordinary(t) for t in texts]


class BpeOpenai(Candidate):
    name, module, dist = "bpe-openai", "bpe_openai", "bpe-openai"
    tiktoken_style = True

    def load(self, path, tk=None):
        if tk is None:
            raise NotImplementedError("knows cl100k_base and o200k_base only, no tokenizer.json")
        import bpe_openai
        return bpe_openai.get_encoding(tk[0])

    def encode(self, h, texts):
        return [h.encode_ordinary(t) for t in texts]


CANDIDATES = [HF(), Fastokens(), Tokie(), Gigatoken(), Kitoken(), Tiktoken(), BpeOpenai()]


def added_tokens_of(path):
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    return [t["content"] for t in d.get("added_tokens") or []]


def _encode_each(cand, h, texts):
    """ids per text, or an exception string; batches of one where a batch fails."""
    try:
        return cand.encode(h, texts)
    except Exception:
        out = []
        for t in texts:
            try:
                out.append(cand.encode(h, [t])[0])
            except Exception as e:  # noqa: BLE001 - recorded as the document's result
                out.append(f"error: {type(e).__name__}: {str(e)[:80]}")
        return out


# ------------------------------------------------------------------ speed (subprocess)

SPEED_CHILD = r"""
import json, os, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(%(script)r)))
import tokenizer_parity as tp
args = json.loads(sys.argv[1])
os.sched_setaffinity(0, set(args["cpus"]))
cand = {c.name: c for c in tp.CANDIDATES}[args["lib"]]
h = cand.load(args["path"], tuple(args["tk"]) if args["tk"] else None)
docs = [t for _, t in tp.corpus_documents(args["limit"])]
batches = [docs[i:i + 64] for i in range(0, len(docs), 64)]
ntok = sum(cand.count(cand.encode_native(h, b)) for b in batches)  # warm-up and count
def run(bs):
    for b in bs: cand.encode_native(h, b)
nt = args["threads"]
best = None
for rep in range(args["reps"]):
    parts = [batches[i::nt] for i in range(nt)]
    ths = [threading.Thread(target=run, args=(p,)) for p in parts]
    t0 = time.perf_counter()
    for t in ths: t.start()
    for t in ths: t.join()
    dt = time.perf_counter() - t0
    best = dt if best is None or dt < best else best
print(json.dumps({"tokens": ntok, "seconds": best}))
"""


def speed(cand, path, tk, threads, cpus, limit, reps=1):
    arg = json.dumps({"lib": cand.name, "path": path, "tk": list(tk) if tk else None,
                      "threads": threads, "cpus": cpus, "limit": limit, "reps": reps})
    code = SPEED_CHILD % {"script": os.path.abspath(__file__)}
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               FASTOKENS_BPE_THREADS="1")
    p = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True,
                       env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return r["tokens"] / r["seconds"]


# ------------------------------------------------------------------ main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="paired speed rounds")
    ap.add_argument("--speed-bytes", type=int, default=4 << 20,
                    help="corpus text per source for the speed runs")
    ap.add_argument("--no-big", action="store_true", help="leave out the 10 MB documents")
    ap.add_argument("--no-claude", action="store_true")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--libs", default=None, help="comma-separated subset of the candidates")
    ap.add_argument("--files", default=None, help="comma-separated subset of the tokenizer files")
    ap.add_argument("--out", default=os.path.join(RESULTS, "tokenizer_parity.json"))
    args = ap.parse_args(argv)
    command = "bench/text/tokenizer_parity.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))

    cands = [c for c in CANDIDATES if c.available()
             and (not args.libs or c.name in args.libs.split(","))]
    missing = [c.name for c in CANDIDATES if not c.available()]
    files = [f for f in tokenizer_files(not args.no_claude)
             if not args.files or f[0] in args.files.split(",")]
    corpus = corpus_documents()
    if not corpus:
        sys.exit("no data/raw/*.jsonl: run scripts/build_corpus.py first")
    print(f"{len(corpus)} corpus documents, {sum(len(t) for _, t in corpus)} characters; "
          f"candidates {[c.name for c in cands]}; not installed {missing}", flush=True)

    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "affinity": len(os.sched_getaffinity(0)), "python": platform.python_version(),
               "loadavg": os.getloadavg()}
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    records, table = [], []

    def rec(figure, value, unit, **kw):
        records.append({"figure": figure, "value": value, "unit": unit, "command": command,
                        "machine": machine, "date": date, **kw})

    hf = cands[0]
    assert hf.name == "tokenizers"
    for fname, path, origin, tk in files:
        added = added_tokens_of(path)
        docs = [(n, t) for n, t in corpus] + [(n, t) for n, t, _ in
                                              hostile_documents(added, corpus, not args.no_big)]
        names = [n for n, _ in docs]
        texts = [t for _, t in docs]
        ref_h = hf.load(path)
        tref = None
        t0 = time.perf_counter()
        ref = []
        for i in range(0, len(texts), 64):
            ref += _encode_each(hf, ref_h, texts[i:i + 64])
        print(f"\n== {fname} ({origin}): {len(docs)} documents, tokenizers {time.perf_counter() - t0:.1f} s",
              flush=True)
        for c in cands[1:]:
            if c.tiktoken_style and tk is None:
                continue
            row = {"library": c.name, "version": c.version(), "file": fname}
            try:
                h = c.load(path, tk)
            except Exception as e:  # noqa: BLE001 - an unsupported file is a result
                row.update(loads=False, reason=f"{type(e).__name__}: {str(e)[:160]}")
                table.append(row)
                rec("loads", 0, "bool", library=c.name, file=fname, reason=row["reason"])
                print(f"  {c.name:11s} cannot load: {row['reason']}", flush=True)
                continue
            diff = []
            t0 = time.perf_counter()
            # bpe-openai is a tiktoken replacement: held against tiktoken's encode_ordinary
            base = tref if c.name == "bpe-openai" else ref
            row["reference"] = "tiktoken" if c.name == "bpe-openai" else "tokenizers"
            out = []
            for i in range(0, len(texts), 64):
                got = _encode_each(c, h, texts[i:i + 64])
                out += got
                for j, g in enumerate(got):
                    r = base[i + j]
                    same = (isinstance(r, str) and isinstance(g, str)) or \
                           (not isinstance(r, str) and not isinstance(g, str) and list(g) == list(r))
                    if not same:
                        diff.append(names[i + j])
            dt = time.perf_counter() - t0
            if c.name == "tiktoken":
                tref = out
            ncorpus = sum(1 for n in diff if ":" in n)
            row.update(loads=True, documents=len(docs), differ=len(diff), differ_corpus=ncorpus,
                       differ_hostile=len(diff) - ncorpus, first_differ=diff[:8])
            table.append(row)
            rec(f"documents with other ids than {row['reference']}", len(diff), "documents", library=c.name,
                file=fname, documents=len(docs), first=diff[:8])
            print(f"  {c.name:11s} vs {row['reference']:10s} differ {len(diff):5d}/{len(docs)} (corpus {ncorpus}, hostile "
                  f"{len(diff) - ncorpus}) {diff[:6]}  [{dt:.1f} s]", flush=True)

    if not args.no_speed:
        ncpu = len(os.sched_getaffinity(0))
        cpus = sorted(os.sched_getaffinity(0))
        print(f"\n== speed: {args.rounds} paired rounds, 1 thread on 1 CPU and {ncpu} threads on "
              f"{ncpu} CPUs, RAYON_NUM_THREADS=1", flush=True)
        for fname, path, origin, tk in files:
            loadable = [r["library"] for r in table if r["file"] == fname and r.get("loads")]
            libs = [c for c in cands if c.name == "tokenizers" or c.name in loadable]
            one = {c.name: [] for c in libs}
            many = {c.name: [] for c in libs}
            for rnd in range(args.rounds):
                order = libs if rnd % 2 == 0 else libs[::-1]
                for c in order:
                    try:
                        one[c.name].append(speed(c, path, tk, 1, cpus[:1], args.speed_bytes))
                        many[c.name].append(speed(c, path, tk, ncpu, cpus, args.speed_bytes))
                    except Exception as e:  # noqa: BLE001
                        print(f"  {c.name}: speed run failed: {e}", flush=True)
            base = statistics.median(one["tokenizers"]) if one["tokenizers"] else float("nan")
            for c in libs:
                if not one[c.name]:
                    continue
                m1 = statistics.median(one[c.name])
                ratios = [b / a for a, b in zip(one[c.name], many[c.name])]
                sc = statistics.median(ratios)
                vs = [a / b for a, b in zip(one[c.name], one["tokenizers"])]
                print(f"  {fname:17s} {c.name:11s} 1 core {m1:9.3g} tok/s "
                      f"[{min(one[c.name]):.3g}-{max(one[c.name]):.3g}]  x{statistics.median(vs):5.2f} "
                      f"tokenizers [{min(vs):.2f}-{max(vs):.2f}]  {ncpu} threads/1: {sc:.2f} "
                      f"[{min(ratios):.2f}-{max(ratios):.2f}]", flush=True)
                rec("tokens/s, one core", m1, "tokens/s", library=c.name, file=fname,
                    rounds=one[c.name])
                rec("speed over tokenizers, one core", statistics.median(vs), "x", library=c.name,
                    file=fname, rounds=vs)
                rec(f"scaling, {ncpu} threads over 1", sc, "x", library=c.name, file=fname,
                    rounds=ratios)
                for r in table:
                    if r["file"] == fname and r["library"] == c.name:
                        r.update(tokens_per_s_1core=m1, vs_tokenizers=statistics.median(vs),
                                 scaling=sc)
                if c.name == "tokenizers":
                    table.append({"library": "tokenizers", "file": fname, "loads": True, "differ": 0,
                                  "tokens_per_s_1core": m1, "scaling": sc, "vs_tokenizers": 1.0})
    abi = {}
    for c in cands:
        syms = c.c_abi()
        abi[c.name] = syms[:10]
        rec("C ABI symbols exported", len(syms), "symbols", library=c.name, symbols=syms[:10])
    print("\nC ABI (exported symbols other than PyInit_*):", {k: v or "none" for k, v in abi.items()})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"records": records, "table": table, "not_installed": missing}, f, indent=1)
    print("wrote", os.path.relpath(args.out, ROOT))


if __name__ == "__main__":
    main()
