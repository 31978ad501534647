"""The library that encodes a ``tokenizer: {type: hf}`` source's ``tokenizer.json``.

``backend: auto`` (the default) uses `fastokens <https://pypi.org/project/fastokens/>`_
where it gives Hugging Face ``tokenizers``' ids for the file, and ``tokenizers``
elsewhere; ``backend: fastokens`` and ``backend: tokenizers`` pick one.  fastokens reads
the same ``tokenizer.json`` and returns a batch's ids as one flat ``uint32`` buffer with
``uint64`` offsets (``encode_batch_flat``), with the GIL released while it encodes: no
Python object per token.  bench/text/tokenizer_parity.py held it against ``tokenizers`` on
every document of the demo corpus and a hostile set for the tokenizer files of several
models: identical ids for the byte-level BPE files it loads (GPT-2 style, Llama 3 /
cl100k and o200k patterns); it refuses Metaspace pre-tokenizers (SentencePiece-style
files) and NFKC normalizers, and would differ from ``tokenizers`` on a regex that the two
regex engines read differently.

So ``auto`` checks each file when it loads it: fastokens must load it, and must give
``tokenizers``' ids for every text of :data:`PROBES` plus the file's own added tokens
inside text.  Otherwise the source tokenizes with ``tokenizers``, and the reason is
logged once per file (logger ``polyload``, level WARNING).  The check costs a load of the
file with ``tokenizers`` and a few hundred kB of encoding; its verdict is kept per file
(path, size, modification time and both libraries' versions) in the process and in
``$XDG_CACHE_HOME/polyload/hf_backend.json`` (``~/.cache`` by default), so other
processes on the machine (ranks, Ray actors, later runs) skip it.

:func:`load` is called by the C source loader's tokenizer factory
(``_core/tokenizer.c``) with the GIL held.

fastokens spreads a batch over worker threads of its own that spin while they wait
(``FASTOKENS_BPE_THREADS``): the source loader already encodes on its own threads
(``tokenizer.threads``), and a Ray source loader on as many as the CPUs it requested, so
this module holds fastokens to the calling thread (``FASTOKENS_BPE_THREADS=1``, unless the
environment sets it before polyload loads a tokenizer).  On the demo corpus that halves
its CPU per token.
"""
import json
import logging
import os
import threading

__all__ = ["BACKENDS", "load"]

log = logging.getLogger("polyload")

#: Values of ``tokenizer.backend`` for ``type: hf``.
BACKENDS = ("auto", "fastokens", "tokenizers")

#: Texts ``auto`` encodes with both libraries before it trusts fastokens with a file:
#: the cases where tokenizer implementations part (scripts, emoji sequences, combining
#: marks, whitespace and digit runs, newlines before indentation, apostrophes, long
#: words), short and in runs.
PROBES = (
    "Hello world! It's a test; they'll see what we've done, don't they? I'M SURE.",
    "Привет мир. Γειά σου κόσμε. مرحبا بالعالم. שלום עולם. नमस्ते दुनिया. สวัสดีชาวโลก.",
    "你好，世界。こんにちは世界。안녕하세요 세계. ᚠᛇᚻ᛫ᛒᛦᚦ Xin chào thế giới",
    "🙂 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇩🇪 1️⃣ ❤️ 🧑🏿‍🚀 😀😃😄",
    "e\u0301 a\u0300\u0316 n\u0303 \u1100\u1161\u11a8 o\u0308\u0304 \u0915\u094d\u0937 "
    + "Z" + "".join(chr(0x300 + i) for i in range(40)),
    "Cafe\u0301 café ﬁ ﬀ Ⅻ ① ｆｕｌｌ ＷＩＤＴＨ ㈱ ㌀ ½ ⁰¹²³ ٠١٢٣٤٥٦٧٨٩ ０１２３",
    "Actresses will happen.\n\t\t-- Addison Mizner, \"The Entirely\n\t\tNew Cynic's\", 1905\n",
    "def f(x):\n    return x  \n\n\n    # trailing   \n\t\tif a:\r\n        pass\n",
    "  leading spaces\n   \n  \t \n" + " " * 300 + "x" + "\n" * 40 + "y" + "\r\n" * 30,
    "\t \n\r\n \u00a0\u3000\u2028\u2029\u200b\ufeff" * 20,
    "3.14159 1,234,567 12345678901234567890 0x1F 1e-9 -42 +7 2026-12-04T18:51:05Z",
    "".join(str(i % 10) for i in range(3000)),
    # numbers of every length from 1 to 12 digits, years, versions, times: where regex
    # engines read digit repetitions (\\p{N}{1,3} and its variants) differently
    " ".join(str(y) for y in range(1890, 2050)) + " "
    + " ".join(str((7 ** k * 1234567) % 10 ** (k % 12 + 1)) for k in range(300)) + " "
    + " ".join(f"v{k % 13}.{k % 7}.{k} {k % 24:02d}:{k % 60:02d} ({k * 37}) #{k * 101}"
               for k in range(120)),
    "x" * 5000 + " " + "abc" * 2000,
    "!?.,;:-_=+*/\\|#@$%^&(){}[]<>~`'\"" * 30,
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE n't O'Neil rock'n'roll ''quoted'' `tick`",
    "smile \U0001f600 ok \ue000\uf8ff \U000f0000 \U0010fffd 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 𓀀 𝄞",
    "a\ufffe b\uffff c\ufdd0 \u0000 \u0001 \u007f \ufffd end",
    "<|endoftext|> <|endoftext|><|endoftext|> <s></s> [INST] [/INST] <unk> <pad> "
    "<|im_start|> <|begin_of_text|> < s > <|endof text|>",
    "",
    " ",
    "\n",
)

_lock = threading.Lock()
_checked = {}  # (path, size, mtime_ns, library versions) -> None or the reason
_logged = set()


_versions = {}


def _version(dist):
    """The installed version of a distribution (looked up once: importlib.metadata scans
    sys.path)."""
    if dist not in _versions:
        from importlib import metadata
        try:
            _versions[dist] = metadata.version(dist)
        except Exception:  # noqa: BLE001 - unknown: the verdict is kept under "?"
            _versions[dist] = "?"
    return _versions[dist]


def _file_key(path):
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns,
            _version("fastokens"), _version("tokenizers"))


def _cache_path():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "polyload", "hf_backend.json")


def _disk_get(key):
    try:
        with open(_cache_path(), encoding="utf-8") as f:
            v = json.load(f).get(json.dumps(key))
        return v["reason"] if isinstance(v, dict) and "reason" in v else "unchecked"
    except (OSError, ValueError, AttributeError):
        return "unchecked"


def _disk_put(key, reason):
    """Best effort: a cache that cannot be written costs a check next time."""
    p = _cache_path()
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
            if not isinstance(d, dict):
                d = {}
        except (OSError, ValueError):
            d = {}
        d[json.dumps(key)] = {"reason": reason}
        tmp = f"{p}.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(d, f)
        os.replace(tmp, p)
    except OSError:
        pass


def _probe_texts(path):
    """PROBES, and the file's added tokens inside text (whole, doubled, cut)."""
    try:
        with open(path, encoding="utf-8") as f:
            added = [t.get("content", "") for t in json.load(f).get("added_tokens") or []]
    except (OSError, ValueError, AttributeError):
        added = []
    texts = list(PROBES)
    for tok in added[:64]:
        if tok:
            texts.append(f"before {tok} after{tok}{tok} {tok[:-1]} {tok[1:]} x{tok.upper()}y")
    return texts


def _fastokens_ids(tok, texts):
    import numpy as np
    ids, off = tok.encode_batch_flat(texts, add_special_tokens=False)
    ids = np.frombuffer(ids, np.uint32)
    off = np.frombuffer(off, np.uint64)
    return [ids[int(off[i]):int(off[i + 1])].tolist() for i in range(len(texts))]


def _check(path, fast, texts):
    """None when fastokens gives tokenizers' ids for every text, else the reason."""
    import tokenizers
    ref = tokenizers.Tokenizer.from_file(path)
    want = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    got = _fastokens_ids(fast, texts)
    for i, (a, b) in enumerate(zip(want, got)):
        if a != b:
            return (f"fastokens gives other ids than tokenizers for probe text {i} "
                    f"({texts[i][:40]!r}...)")
    n_ref = ref.get_vocab_size(with_added_tokens=True)
    if fast.vocab_size != n_ref:
        return f"fastokens counts {fast.vocab_size} tokens, tokenizers {n_ref}"
    return None


def _fallback(path, reason):
    key = (os.path.realpath(path), reason)
    with _lock:
        first = key not in _logged
        _logged.add(key)
    if first:
        log.warning("%s: tokenizing with tokenizers, not fastokens: %s", path, reason)


def _import_fastokens():
    os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
    import fastokens
    return fastokens


def load(path, backend="auto"):
    """The encoder of a tokenizer.json: ``(library, tokenizer)``.

    ``library`` is ``"fastokens"`` (call ``encode_batch_flat(texts,
    add_special_tokens=False)``) or ``"tokenizers"`` (a ``tokenizers.Tokenizer``).
    ``backend``: ``"auto"`` (fastokens where it loads the file and passes the check,
    see the module docstring), ``"fastokens"`` (no check; its load errors are raised) or
    ``"tokenizers"``.  Raises ValueError for another backend, and what the library
    raises for a file it cannot load."""
    backend = backend or "auto"
    if backend not in BACKENDS:
        raise ValueError(f"{path}: tokenizer backend {backend!r} is not one of "
                         f"{', '.join(BACKENDS)}")
    if backend == "tokenizers":
        import tokenizers
        return "tokenizers", tokenizers.Tokenizer.from_file(path)
    try:
        fastokens = _import_fastokens()
    except ImportError:
        if backend == "fastokens":
            raise ValueError(f"{path}: backend fastokens: the fastokens package is not "
                             "installed (pip install fastokens)") from None
        _fallback(path, "the fastokens package is not installed")
        import tokenizers
        return "tokenizers", tokenizers.Tokenizer.from_file(path)
    if backend == "fastokens":
        return "fastokens", fastokens.Tokenizer.from_file(path)
    key = _file_key(path)
    with _lock:
        reason = _checked.get(key, "unchecked")
    if reason == "unchecked":
        reason = _disk_get(key)
        if reason != "unchecked":
            with _lock:
                _checked[key] = reason
    if reason == "unchecked":
        try:
            fast = fastokens.Tokenizer.from_file(path)
            reason = _check(path, fast, _probe_texts(path))
        except Exception as e:  # noqa: BLE001 - any failure means: use tokenizers
            fast, reason = None, f"fastokens cannot load it ({type(e).__name__}: {str(e)[:200]})"
        with _lock:
            _checked[key] = reason
        _disk_put(key, reason)
        if reason is None:
            return "fastokens", fast
    elif reason is None:
        return "fastokens", fastokens.Tokenizer.from_file(path)
    _fallback(path, reason)
    import tokenizers
    return "tokenizers", tokenizers.Tokenizer.from_file(path)
