"""``polyload prepare``: raw text into a Megatron indexed dataset.

Three commands::

    polyload prepare --input A.jsonl docs/ "more/*.txt" --output-prefix data/web \\
        --tokenizer tokenizer.json [--json-key text] [--no-append-eod] [--workers N] [--skip-bad]
    polyload prepare train-tokenizer --input A.jsonl B.jsonl --output tokenizer.json
    polyload prepare tiktoken --tokenizer tokenizer.json --output tok.tiktoken

``tiktoken`` converts a byte-level BPE ``tokenizer.json`` into a ``.tiktoken`` file for
``tokenizer: {type: tiktoken}`` sources (polyload._tiktoken.tokenizer_json_to_tiktoken).

Inputs are files, directories (walked recursively, sorted) or globs, taken in the order
given and, within one argument, in sorted path order.  A ``.jsonl`` (``.jsonl.gz``,
``.ndjson``) file holds one JSON object per line whose ``--json-key`` field is a
document; any other file is one document of UTF-8 text.  Blank JSONL lines are ignored.

Tokenization uses a Hugging Face ``tokenizers`` tokenizer (a ``tokenizer.json``), in
batches with ``Tokenizer.encode_batch`` (Rust threads; ``--workers`` sets their number),
without the tokenizer's own special tokens.  With ``--append-eod`` (the default, as
Megatron-LM's ``tools/preprocess_data.py --append-eod``) each document ends with the
tokenizer's end-of-document token.

The output is Megatron-LM's indexed dataset (``MMIDIDX``, version 1): ``PREFIX.bin`` holds
the tokens of every document back to back; ``PREFIX.idx`` holds the header, the token dtype
code, the sequence count, the document count + 1, the int32 length of each sequence, the
int64 byte offset of each sequence and the int64 document boundaries.  Each document is one
sequence, as ``preprocess_data.py`` writes it without sentence splitting.  The token dtype is
uint16 when the vocabulary has fewer than 65500 entries, else int32
(``DType.optimal_dtype``).  It is written with megatron-core's own
``megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder`` when that imports, else by
:class:`NumpyIndexedWriter`, which writes identical bytes.  Both files are written under
temporary names and renamed when complete, the ``.idx`` last.

Errors in the input (malformed JSON, a missing or non-string text field, invalid UTF-8)
raise :class:`PrepareError` naming the file, the line and the byte offset; with
``skip_bad`` they are counted and skipped.  The command exits 0 on success, 1 on a data
error and 2 on a usage error.
"""

import argparse
import glob
import gzip
import json
import os
import random
import struct
import sys
import warnings
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "PrepareError",
    "PrepareStats",
    "NumpyIndexedWriter",
    "expand_inputs",
    "iter_documents",
    "find_eod_id",
    "prepare",
    "read_index",
    "train_tokenizer",
    "main",
]

#: Magic bytes that open a Megatron ``.idx`` file, followed by version 1 as ``<Q``.
MMIDIDX_MAGIC = b"MMIDIDX\x00\x00"
#: Megatron's ``DType`` codes for the token dtypes ``prepare`` writes (and can read).
DTYPE_CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
#: End-of-document tokens looked for, in this order, when none is named.
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")
#: Special tokens of the tokenizer ``train_tokenizer`` makes.
SPECIAL_TOKENS = ("<|endoftext|>", "<pad>")

_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")


class PrepareError(Exception):
    """A bad input or argument; the message names the file, line and byte offset."""


@dataclass
class PrepareStats:
    """What :func:`prepare` wrote."""

    files: int = 0
    documents: int = 0
    tokens: int = 0
    skipped: int = 0  # malformed records skipped under skip_bad
    empty: int = 0  # documents without tokens (empty text), not written
    dtype: str = ""
    writer: str = ""
    eod_id: int = -1
    skip_messages: list = field(default_factory=list)  # the first few skip reasons


# ----------------------------------------------------------------------------- inputs


def expand_inputs(inputs):
    """Expand files, directories and globs into a list of file paths.

    Order: the arguments as given; within one argument, sorted paths.  Directories are
    walked recursively; hidden files are left out.  Raises PrepareError when an argument
    matches no file.
    """
    paths = []
    for arg in inputs:
        if os.path.isdir(arg):
            found = []
            for root, dirs, files in os.walk(arg):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                found.extend(os.path.join(root, f) for f in files if not f.startswith("."))
            found.sort()
        elif os.path.isfile(arg):
            found = [arg]
        elif glob.has_magic(arg):
            found = sorted(p for p in glob.glob(arg, recursive=True) if os.path.isfile(p))
        else:
            found = []
        if not found:
            raise PrepareError(f"{arg}: no such file, directory or matching glob")
        paths.extend(found)
    return paths


def _is_jsonl(path):
    return path.endswith(_JSONL_SUFFIXES)


def _open_binary(path):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


class _Bad:
    """Raises or counts a bad record, depending on skip_bad."""

    def __init__(self, skip_bad, stats):
        self.skip_bad = skip_bad
        self.stats = stats

    def __call__(self, message):
        if not self.skip_bad:
            raise PrepareError(message)
        if self.stats is not None:
            self.stats.skipped += 1
            if len(self.stats.skip_messages) < 10:
                self.stats.skip_messages.append(message)


def iter_documents(paths, json_key="text", skip_bad=False, stats=None):
    """Yield the text of every document of ``paths`` (see the module doc), in order.

    Raises PrepareError for a malformed record unless ``skip_bad``; then it is counted in
    ``stats.skipped`` (``stats``, a PrepareStats, may be None).
    """
    bad = _Bad(skip_bad, stats)
    for path in paths:
        if stats is not None:
            stats.files += 1
        if _is_jsonl(path):
            yield from _iter_jsonl(path, json_key, bad)
            continue
        with _open_binary(path) as f:
            data = f.read()
        try:
            yield data.decode("utf-8")
        except UnicodeDecodeError as e:
            bad(f"{path}: byte offset {e.start}: invalid UTF-8 ({e.reason})")


def _iter_jsonl(path, json_key, bad):
    offset = 0
    with _open_binary(path) as f:
        for lineno, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            where = f"{path}: line {lineno} (byte offset {start})"
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError as e:
                bad(f"{where}: invalid UTF-8 at byte {start + e.start}")
                continue
            except ValueError as e:
                bad(f"{where}: malformed JSON: {e}")
                continue
            if not isinstance(obj, dict):
                bad(f"{where}: expected a JSON object, got {type(obj).__name__}")
                continue
            text = obj.get(json_key)
            if not isinstance(text, str):
                what = "missing" if json_key not in obj else f"a {type(text).__name__}"
                bad(f"{where}: field {json_key!r} is {what}, expected a string")
                continue
            yield text


# -------------------------------------------------------------------------- tokenizer


def _load_tokenizer(tokenizer):
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    try:
        return Tokenizer.from_file(os.fspath(tokenizer))
    except Exception as e:  # tokenizers raises a bare Exception
        raise PrepareError(f"{tokenizer}: cannot load tokenizer: {e}") from None


def find_eod_id(tok, eod_token=None):
    """The id of the end-of-document token: ``eod_token`` if given, else the first of
    EOD_CANDIDATES that the vocabulary has.  Raises PrepareError when there is none."""
    names = [eod_token] if eod_token else list(EOD_CANDIDATES)
    for name in names:
        tid = tok.token_to_id(name)
        if tid is not None:
            return tid
    raise PrepareError(
        f"tokenizer has no end-of-document token (looked for {', '.join(names)}); "
        "name one with --eod-token or use --no-append-eod"
    )


def token_dtype(vocab_size):
    """Megatron's choice: uint16 when vocab_size < 65500, else int32."""
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


# ---------------------------------------------------------------------------- writers


def _tmp(path):
    return f"{path}.tmp{os.getpid()}"


class NumpyIndexedWriter:
    """Writes Megatron's MMIDIDX v1 ``.bin``/``.idx`` pair with numpy only.

    Byte-for-byte what ``IndexedDatasetBuilder.add_document(ids, [len(ids)])`` followed by
    ``finalize`` writes (megatron/core/datasets/indexed_dataset.py, ``_IndexWriter``).
    """

    name = "numpy"

    def __init__(self, bin_path, dtype):
        self.dtype = np.dtype(dtype)
        self.data_file = open(bin_path, "wb")
        self.lengths = []

    def add_document(self, ids):
        arr = np.asarray(ids, dtype=self.dtype)
        self.data_file.write(arr.tobytes(order="C"))
        self.lengths.append(arr.size)

    def finalize(self, idx_path):
        self.data_file.close()
        lengths = np.asarray(self.lengths, dtype=np.int32)
        pointers = np.zeros(len(lengths), dtype=np.int64)
        if len(lengths) > 1:
            np.cumsum(lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        doc_indices = np.arange(len(lengths) + 1, dtype=np.int64)
        with open(idx_path, "wb") as f:
            f.write(MMIDIDX_MAGIC)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", DTYPE_CODES[self.dtype]))
            f.write(struct.pack("<Q", len(lengths)))
            f.write(struct.pack("<Q", len(doc_indices)))
            f.write(lengths.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(doc_indices.tobytes(order="C"))

    def abort(self):
        self.data_file.close()


def _import_megatron_builder():
    """megatron-core's IndexedDatasetBuilder, or None when megatron-core is absent."""
    with warnings.catch_warnings():
        # megatron.core warns about optional Transformer Engine / Apex on import.
        warnings.simplefilter("ignore")
        try:
            from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
        except ImportError:
            return None
    return IndexedDatasetBuilder


class MegatronIndexedWriter:
    """megatron-core's IndexedDatasetBuilder, one sequence per document."""

    name = "megatron"

    def __init__(self, bin_path, dtype):
        builder = _import_megatron_builder()
        if builder is None:
            raise PrepareError("--writer megatron: megatron-core is not installed")
        self.dtype = np.dtype(dtype)
        self.builder = builder(bin_path, dtype=self.dtype.type)

    def add_document(self, ids):
        arr = np.asarray(ids, dtype=self.dtype)
        self.builder.add_document(arr, [arr.size])

    def finalize(self, idx_path):
        self.builder.finalize(idx_path)

    def abort(self):
        self.builder.data_file.close()


def _make_writer(kind, bin_path, dtype):
    if kind == "auto":
        kind = "megatron" if _import_megatron_builder() is not None else "numpy"
    if kind == "megatron":
        return MegatronIndexedWriter(bin_path, dtype)
    if kind == "numpy":
        return NumpyIndexedWriter(bin_path, dtype)
    raise PrepareError(f"unknown writer {kind!r} (auto, megatron, numpy)")


def read_index(prefix):
    """Parse ``PREFIX.idx`` (MMIDIDX v1) into a dict: ``dtype`` (numpy dtype),
    ``sequence_lengths`` (int32), ``sequence_pointers`` (int64 byte offsets),
    ``document_indices`` (int64).  Raises PrepareError for a file that is not one."""
    path = f"{prefix}.idx"
    with open(path, "rb") as f:
        data = f.read()
    head = len(MMIDIDX_MAGIC) + 8 + 1 + 8 + 8
    if len(data) < head or not data.startswith(MMIDIDX_MAGIC):
        raise PrepareError(f"{path}: byte offset 0: bad magic, expected MMIDIDX")
    (version,) = struct.unpack_from("<Q", data, 9)
    if version != 1:
        raise PrepareError(f"{path}: byte offset 9: version {version}, expected 1")
    code = data[17]
    codes = {v: k for k, v in DTYPE_CODES.items()}
    if code not in codes:
        raise PrepareError(f"{path}: byte offset 17: unknown dtype code {code}")
    n_seq, n_doc = struct.unpack_from("<QQ", data, 18)
    need = head + 4 * n_seq + 8 * n_seq + 8 * n_doc
    if len(data) < need:
        raise PrepareError(f"{path}: truncated: {len(data)} bytes, expected {need}")
    off = head
    lengths = np.frombuffer(data, np.int32, n_seq, off)
    off += 4 * n_seq
    pointers = np.frombuffer(data, np.int64, n_seq, off)
    off += 8 * n_seq
    docs = np.frombuffer(data, np.int64, n_doc, off)
    return {
        "dtype": codes[code],
        "sequence_lengths": lengths,
        "sequence_pointers": pointers,
        "document_indices": docs,
    }


# ---------------------------------------------------------------------------- prepare


def _batches(docs, max_docs, max_chars):
    batch, size = [], 0
    for text in docs:
        batch.append(text)
        size += len(text)
        if len(batch) >= max_docs or size >= max_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def prepare(
    inputs,
    output_prefix,
    tokenizer,
    json_key="text",
    append_eod=True,
    eod_token=None,
    skip_bad=False,
    writer="auto",
    batch_docs=1024,
    batch_chars=4 << 20,
    progress=False,
):
    """Tokenize ``inputs`` (paths, directories or globs) into ``output_prefix``.{bin,idx}.

    ``tokenizer`` is a path to a ``tokenizer.json`` or a ``tokenizers.Tokenizer``.
    ``writer`` is "auto" (megatron-core if importable, else numpy), "megatron" or "numpy".
    Returns a PrepareStats.  Raises PrepareError for bad input (nothing is left at the
    output paths then) and OSError for I/O failures.
    """
    tok = _load_tokenizer(tokenizer)
    stats = PrepareStats()
    eod = find_eod_id(tok, eod_token) if append_eod else None
    stats.eod_id = -1 if eod is None else eod
    dtype = token_dtype(tok.get_vocab_size(with_added_tokens=True))
    stats.dtype = dtype.name
    paths = expand_inputs(inputs)

    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(out_dir, exist_ok=True)
    bin_path, idx_path = f"{output_prefix}.bin", f"{output_prefix}.idx"
    bin_tmp, idx_tmp = _tmp(bin_path), _tmp(idx_path)
    w = _make_writer(writer, bin_tmp, dtype)
    stats.writer = w.name
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc=os.path.basename(output_prefix), unit="doc", disable=None)
    try:
        docs = iter_documents(paths, json_key, skip_bad, stats)
        for batch in _batches(docs, batch_docs, batch_chars):
            for enc in tok.encode_batch(batch, add_special_tokens=False):
                ids = enc.ids
                if not ids:
                    stats.empty += 1
                    continue
                if eod is not None:
                    ids.append(eod)
                w.add_document(ids)
                stats.documents += 1
                stats.tokens += len(ids)
            if bar is not None:
                bar.update(len(batch))
        w.finalize(idx_tmp)
        os.replace(bin_tmp, bin_path)
        os.replace(idx_tmp, idx_path)
    except BaseException:
        w.abort()
        for p in (bin_tmp, idx_tmp):
            if os.path.exists(p):
                os.unlink(p)
        raise
    finally:
        if bar is not None:
            bar.close()
    return stats


# -------------------------------------------------------------------- train-tokenizer


def _sample_texts(inputs, json_key, sample_bytes, max_doc_chars, seed):
    """A deterministic sample of about ``sample_bytes`` characters, an equal share from
    each input argument, documents drawn in a seeded random order and cut to
    ``max_doc_chars``."""
    share = max(1, sample_bytes // max(1, len(inputs)))
    texts = []
    for arg in inputs:
        docs = list(iter_documents(expand_inputs([arg]), json_key, skip_bad=True))
        order = list(range(len(docs)))
        random.Random(seed).shuffle(order)
        taken = 0
        for i in order:
            if taken >= share:
                break
            text = docs[i][:max_doc_chars]
            texts.append(text)
            taken += len(text)
    return texts


def train_tokenizer(
    inputs,
    output,
    vocab_size=32000,
    json_key="text",
    sample_bytes=24 << 20,
    max_doc_chars=64 << 10,
    min_frequency=2,
    seed=0,
    progress=False,
):
    """Train a byte-level BPE tokenizer (GPT-2 style, Hugging Face ``tokenizers``) with
    special tokens ``<|endoftext|>`` (id 0) and ``<pad>`` (id 1), and save it to ``output``
    (a ``tokenizer.json``).  Each input argument contributes an equal share of the
    ``sample_bytes`` training sample.  Decoding reproduces the text exactly (no
    normalizer).  Returns the Tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = _sample_texts(inputs, json_key, sample_bytes, max_doc_chars, seed)
    if not texts:
        raise PrepareError("train-tokenizer: the inputs hold no documents")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    out_dir = os.path.dirname(os.path.abspath(output))
    os.makedirs(out_dir, exist_ok=True)
    tmp = _tmp(output)
    tok.save(tmp)
    os.replace(tmp, output)
    return tok


# -------------------------------------------------------------------------------- CLI


def _set_workers(workers):
    # encode_batch and the BPE trainer run on Rayon's global pool, which reads this
    # variable when it first starts (once per process).
    if workers:
        os.environ["RAYON_NUM_THREADS"] = str(workers)


def _input_arg(p):
    p.add_argument(
        "--input",
        nargs="+",
        action="extend",
        required=True,
        metavar="PATH",
        help="files, directories or globs (.jsonl: one JSON object per line; "
        "other files: one document each); may be repeated",
    )
    p.add_argument("--json-key", default="text", help="JSONL field holding the text (default: text)")
    p.add_argument("--workers", type=int, default=None, help="tokenizer threads (default: all cores)")


def _prepare_parser():
    p = argparse.ArgumentParser(
        prog="polyload prepare",
        description="Tokenize raw text into a Megatron indexed dataset (PREFIX.bin, PREFIX.idx). "
        "See also: polyload prepare train-tokenizer --help.",
    )
    _input_arg(p)
    p.add_argument("--output-prefix", required=True, help="writes OUTPUT_PREFIX.bin and .idx")
    p.add_argument("--tokenizer", required=True, metavar="PATH", help="a Hugging Face tokenizer.json")
    p.add_argument(
        "--append-eod",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="end each document with the end-of-document token (default: on)",
    )
    p.add_argument("--eod-token", default=None, help=f"its name (default: first of {', '.join(EOD_CANDIDATES)})")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed records and count them")
    p.add_argument("--writer", choices=("auto", "megatron", "numpy"), default="auto",
                   help="megatron-core's IndexedDatasetBuilder or the numpy writer (same bytes)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    return p


def _train_parser():
    p = argparse.ArgumentParser(
        prog="polyload prepare train-tokenizer",
        description="Train a byte-level BPE tokenizer (special tokens <|endoftext|>, <pad>) "
        "on a sample of the inputs and save it as tokenizer.json.",
    )
    _input_arg(p)
    p.add_argument("--output", required=True, help="the tokenizer.json to write")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--sample-bytes", type=int, default=24 << 20,
                   help="characters of training text, shared equally by the --input arguments")
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    return p


def _tiktoken_parser():
    p = argparse.ArgumentParser(
        prog="polyload prepare tiktoken",
        description="Convert a byte-level BPE tokenizer.json (GPT-2 style) into a .tiktoken "
                    "file (rank = id; special tokens are left out and listed) for "
                    "`tokenizer: {type: tiktoken}`.",
    )
    p.add_argument("--tokenizer", required=True, help="the tokenizer.json to convert")
    p.add_argument("--output", required=True, help="the .tiktoken file to write")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv=None):
    """Entry point of ``polyload prepare``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "tiktoken":
            from ._tiktoken import TiktokenFileError, tokenizer_json_to_tiktoken

            args = _tiktoken_parser().parse_args(argv[1:])
            try:
                info = tokenizer_json_to_tiktoken(args.tokenizer, args.output)
            except TiktokenFileError as e:
                raise PrepareError(str(e)) from None
            if not args.quiet:
                specials = ", ".join(f"{k}={v}" for k, v in info["special_tokens"].items())
                print(f"wrote {args.output}: {info['ranks']} ranks; special tokens left out: "
                      f"{specials or 'none'}")
            return 0
        if argv and argv[0] == "train-tokenizer":
            args = _train_parser().parse_args(argv[1:])
            _set_workers(args.workers)
            tok = train_tokenizer(
                args.input, args.output, vocab_size=args.vocab_size, json_key=args.json_key,
                sample_bytes=args.sample_bytes, min_frequency=args.min_frequency,
                seed=args.seed, progress=not args.quiet and sys.stderr.isatty(),
            )
            if not args.quiet:
                print(f"wrote {args.output}: vocab {tok.get_vocab_size()}")
            return 0
        args = _prepare_parser().parse_args(argv)
        _set_workers(args.workers)
        st = prepare(
            args.input, args.output_prefix, args.tokenizer, json_key=args.json_key,
            append_eod=args.append_eod, eod_token=args.eod_token, skip_bad=args.skip_bad,
            writer=args.writer, progress=not args.quiet,
        )
    except PrepareError as e:
        print(f"polyload prepare: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"polyload prepare: {e}", file=sys.stderr)
        return 1
    for msg in st.skip_messages:
        print(f"polyload prepare: skipped: {msg}", file=sys.stderr)
    if not args.quiet:
        print(
            f"wrote {args.output_prefix}.bin/.idx: {st.documents} documents, {st.tokens} tokens "
            f"({st.dtype}, {st.writer} writer) from {st.files} files; "
            f"skipped {st.skipped}, empty {st.empty}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
