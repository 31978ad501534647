"""tiktoken encodings from local ``.tiktoken`` files (config ``tokenizer: {type: tiktoken}``).

Nothing is downloaded: the mergeable ranks come from the file named by ``path``
(tiktoken's format: one ``base64(token bytes) rank`` pair per line), the pre-tokenizer
pattern from ``pat_str`` or, with ``encoding``, from tiktoken's own definition of that
published encoding (``tiktoken_ext.openai_public``: its ``pat_str``, special tokens and
vocabulary size, with its download replaced by the local file).

The C source loader (``_core/tokenizer.c``) calls :func:`load_encoding` once per source
and then ``Encoding.encode_ordinary`` for each text of a batch, the GIL taken once per
batch (tiktoken's Rust core releases it while it encodes).  :func:`tokenizer_json_to_tiktoken`
converts a byte-level BPE ``tokenizer.json`` (GPT-2 style, Hugging Face ``tokenizers``)
into a ``.tiktoken`` file (``polyload prepare tiktoken``).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading

# The encodings of tiktoken_ext.openai_public, by the name tiktoken.get_encoding takes.
KNOWN_ENCODINGS = ("gpt2", "r50k_base", "p50k_base", "p50k_edit", "cl100k_base",
                   "o200k_base", "o200k_harmony")

_lock = threading.Lock()


class TiktokenFileError(ValueError):
    """A .tiktoken file, a tokenizer.json or an encoding name that cannot be used."""


def read_ranks(path) -> dict[bytes, int]:
    """The mergeable ranks of a ``.tiktoken`` file; TiktokenFileError naming the line."""
    path = os.fspath(path)
    ranks: dict[bytes, int] = {}
    seen: dict[int, int] = {}
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TiktokenFileError(f"{path}: cannot open: {e.strerror}") from None
    with f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2:
                raise TiktokenFileError(f"{path}: line {n}: expected 'base64-token rank'")
            try:
                tok = base64.b64decode(parts[0], validate=True)
                rank = int(parts[1])
            except (binascii.Error, ValueError):
                raise TiktokenFileError(
                    f"{path}: line {n}: expected 'base64-token rank'") from None
            if not tok or rank < 0 or rank > 2**31 - 2:
                raise TiktokenFileError(f"{path}: line {n}: empty token or rank {rank} out "
                                        "of range")
            if tok in ranks:
                raise TiktokenFileError(f"{path}: line {n}: token {tok!r} appears twice")
            if rank in seen:
                raise TiktokenFileError(f"{path}: line {n}: rank {rank} already on line "
                                        f"{seen[rank]}")
            ranks[tok] = rank
            seen[rank] = n
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TiktokenFileError(f"{path}: {len(missing)} single bytes have no rank (e.g. "
                                f"0x{missing[0]:02x}); byte-level BPE needs all 256")
    return ranks


def _published(name: str, ranks: dict[bytes, int]) -> dict:
    """tiktoken's own constructor of encoding `name`, with the local ranks."""
    if name not in KNOWN_ENCODINGS:
        raise TiktokenFileError(f"unknown tiktoken encoding {name!r} (known: "
                                f"{', '.join(KNOWN_ENCODINGS)})")
    import tiktoken_ext.openai_public as op

    with _lock:
        saved = op.load_tiktoken_bpe, op.data_gym_to_mergeable_bpe_ranks
        op.load_tiktoken_bpe = lambda *a, **k: ranks
        op.data_gym_to_mergeable_bpe_ranks = lambda *a, **k: ranks
        try:
            return getattr(op, name)()
        finally:
            op.load_tiktoken_bpe, op.data_gym_to_mergeable_bpe_ranks = saved


def load_encoding(path, pat_str=None, encoding=None):
    """``(tiktoken.Encoding, eos_id, n_vocab)`` for a local ``.tiktoken`` file.

    ``encoding``: a name of KNOWN_ENCODINGS: its pattern, special tokens and (where
    tiktoken fixes one) vocabulary size apply, and the file must hold its ranks.
    ``pat_str``: the pre-tokenizer regex, or a name of KNOWN_ENCODINGS for its pattern
    only; no special tokens (the source's ``eos_id`` names the end-of-document id).
    eos_id is the first of polyload.prepare.EOD_CANDIDATES among the special tokens, or
    -1.  Raises TiktokenFileError."""
    import tiktoken

    from .prepare import EOD_CANDIDATES

    if (pat_str is None) == (encoding is None):
        raise TiktokenFileError("tiktoken: give one of pat_str and encoding")
    path = os.fspath(path)
    ranks = read_ranks(path)
    specials: dict[str, int] = {}
    n_vocab = None
    if encoding is not None:
        spec = _published(encoding, ranks)
        pat_str, specials = spec["pat_str"], dict(spec["special_tokens"])
        n_vocab = spec.get("explicit_n_vocab")
    elif pat_str in KNOWN_ENCODINGS:
        pat_str = _published(pat_str, ranks)["pat_str"]
    top = max(ranks.values())
    clash = [(t, i) for t, i in specials.items() if i <= top and i in set(ranks.values())]
    if clash:
        raise TiktokenFileError(
            f"{path}: special token {clash[0][0]} of encoding {encoding} has id "
            f"{clash[0][1]}, a rank of the file: the file does not hold {encoding}'s ranks")
    if n_vocab is not None and len(ranks) + len(specials) != n_vocab:
        raise TiktokenFileError(
            f"{path}: {len(ranks)} ranks + {len(specials)} special tokens, encoding "
            f"{encoding} has {n_vocab}: the file does not hold {encoding}'s ranks")
    try:
        enc = tiktoken.Encoding(f"{encoding or 'custom'}:{os.path.basename(path)}",
                                pat_str=pat_str, mergeable_ranks=ranks,
                                special_tokens=specials, explicit_n_vocab=n_vocab)
    except Exception as e:  # the regex compiler (fancy-regex) raises ValueError
        raise TiktokenFileError(f"{path}: tiktoken refuses the encoding: {e}") from None
    eos = next((specials[c] for c in EOD_CANDIDATES if c in specials), -1)
    return enc, eos, enc.n_vocab


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable character table (openai/gpt-2 encoder.py), as
    tokenizers' ByteLevel uses it."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tokenizer_json_to_tiktoken(tokenizer_json, output) -> dict:
    """Write the ranks of a byte-level BPE ``tokenizer.json`` as a ``.tiktoken`` file.

    Rank = the token's id; the added (special) tokens are left out and returned, as
    ``{"ranks": n, "special_tokens": {content: id}}``.  tiktoken merges by the rank of
    the merged bytes, tokenizers by the rank of the merge, so the conversion is exact
    only when each merge's result has a larger id than both its parts and than every
    earlier merge's result (true of GPT-2 and of BPE models trained by tokenizers);
    TiktokenFileError otherwise, and for models that are not byte-level BPE."""
    tokenizer_json = os.fspath(tokenizer_json)
    with open(tokenizer_json, encoding="utf-8") as f:
        d = json.load(f)
    model = d.get("model") or {}
    if model.get("type") != "BPE":
        raise TiktokenFileError(f"{tokenizer_json}: model type {model.get('type')!r}, "
                                "not BPE")
    if d.get("normalizer") is not None:
        raise TiktokenFileError(f"{tokenizer_json}: has a normalizer, which tiktoken "
                                "does not run")
    pre = json.dumps(d.get("pre_tokenizer"))
    if '"ByteLevel"' not in pre:
        raise TiktokenFileError(f"{tokenizer_json}: pre-tokenizer is not ByteLevel")
    u2b = {c: b for b, c in _bytes_to_unicode().items()}
    added = {t["content"]: t["id"] for t in d.get("added_tokens", [])}
    vocab = model["vocab"]
    ranks: dict[bytes, int] = {}
    for tok, i in vocab.items():
        if tok in added:
            continue
        try:
            ranks[bytes(u2b[c] for c in tok)] = i
        except KeyError:
            raise TiktokenFileError(f"{tokenizer_json}: token {tok!r} is not byte-level"
                                    ) from None
    last = -1
    for k, m in enumerate(model.get("merges", [])):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        r = vocab.get(a + b)
        if r is None or r <= max(vocab[a], vocab[b]) or r <= last:
            raise TiktokenFileError(
                f"{tokenizer_json}: merge {k} ({a!r} {b!r}) does not give a token of "
                "larger id than its parts and the merges before it: tiktoken would merge "
                "in another order")
        last = r
    missing = [x for x in range(256) if bytes([x]) not in ranks]
    if missing:
        raise TiktokenFileError(f"{tokenizer_json}: byte 0x{missing[0]:02x} has no token")
    output = os.fspath(output)
    tmp = f"{output}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        for tok, i in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(tok) + b" " + str(i).encode() + b"\n")
    os.replace(tmp, output)
    return {"ranks": len(ranks), "special_tokens": added}
