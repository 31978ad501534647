"""A small real-text corpus for the training and plan tests, built in a temporary directory
from the Debian package ``fortunes`` (installed by the Makefile with the other Debian
packages) by the project's own tools, as ``make demo`` builds data/:

- ``python -m polyload prepare train-tokenizer``: a byte-level BPE (``<|endoftext|>`` = 0,
  ``<pad>`` = 1) with a small vocabulary, so a tiny model trains in seconds;
- ``python -m polyload prepare --writer numpy``: two Megatron indexed datasets, ``tech`` (fortunes
  ``computers`` and ``linux``) and ``wit`` (``humorists``, ``law``, ``food``), one document
  per ``%``-separated entry.

It does not use data/ (the demo corpus), so the tests run on a fresh checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

FORTUNES = "/usr/share/games/fortunes"
SOURCES = {"tech": ("computers", "linux"), "wit": ("humorists", "law", "food")}
VOCAB_SIZE = 512

_built: dict = {}


def _entries(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return [e.strip("\n") + "\n" for e in text.split("\n%\n") if e.strip()]


def _run(args):
    r = subprocess.run([sys.executable, "-m", "polyload"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"polyload {' '.join(args)} exited {r.returncode}: {r.stderr}")


def build(directory) -> dict:
    """Build (once per process) the corpus under ``directory``; returns
    ``{"dir", "tokenizer", "vocab_size", "prefixes": {name: prefix}}``.  Raises
    FileNotFoundError naming the Debian package when the fortunes are missing."""
    if "corpus" in _built:
        return _built["corpus"]
    directory = str(directory)
    missing = [n for names in SOURCES.values() for n in names
               if not os.path.isfile(os.path.join(FORTUNES, n))]
    if missing:
        raise FileNotFoundError(
            f"{FORTUNES}/{missing[0]} is missing: install the Debian package 'fortunes' "
            "(`make deps` does)")
    jsonl = {}
    for name, files in SOURCES.items():
        jsonl[name] = os.path.join(directory, f"{name}.jsonl")
        with open(jsonl[name], "w", encoding="utf-8") as f:
            for n in files:
                for e in _entries(os.path.join(FORTUNES, n)):
                    f.write(json.dumps({"text": e}, ensure_ascii=False) + "\n")
    tokenizer = os.path.join(directory, "tokenizer.json")
    _run(["prepare", "train-tokenizer", "--input", *jsonl.values(), "--output", tokenizer,
          "--vocab-size", str(VOCAB_SIZE), "--workers", "2", "--quiet"])
    prefixes = {}
    for name, path in jsonl.items():
        prefixes[name] = os.path.join(directory, f"{name}_text_document")
        _run(["prepare", "--input", path, "--output-prefix", prefixes[name], "--tokenizer",
              tokenizer, "--workers", "2", "--quiet",
              # the numpy writer: the same bytes as megatron-core's (test_prepare.py), without
              # importing megatron-core (seconds)
              "--writer", "numpy"])
    _built["corpus"] = {"dir": directory, "tokenizer": tokenizer, "vocab_size": VOCAB_SIZE,
                        "prefixes": prefixes}
    return _built["corpus"]


def config(corpus: dict, **overrides) -> dict:
    """A polyload config over the corpus (SPEC section 5), small enough for a tiny GPT on
    CPU: sequences of 128 tokens, 8 per step, micro-batches of 2, dp 2."""
    cfg = {
        "seed": 1234,
        "seq_length": 128,
        "global_batch_size": 8,
        "micro_batch_size": 2,
        "train_steps": 1000,
        "dtype": "int64",
        "pad_id": 1,
        "packing": "best_fit",
        "balance": "none",
        "topology": {"dp": 2, "pp": 1, "cp": 1, "tp": 1},
        "threads": 1,
        "prefetch": 2,
        "sources": [
            {"name": "tech", "type": "megatron", "path": corpus["prefixes"]["tech"], "weight": 0.6},
            {"name": "wit", "type": "megatron", "path": corpus["prefixes"]["wit"], "weight": 0.4},
        ],
    }
    cfg.update(overrides)
    return cfg


def open_source(cfg: dict, i: int):
    """Source ``i`` of config dict ``cfg``, opened by the C core (``_core.Source``)."""
    from polyload import _core  # noqa: PLC0415

    return _core.Config.parse_string(json.dumps(cfg)).open_source(i)


def batch_hashes(cfg: dict, steps: int) -> list:
    """sha256 of every micro-batch's SPEC fields of every DP rank, ``steps`` steps."""
    import hashlib  # noqa: PLC0415

    import polyload  # noqa: PLC0415

    out = []
    cfg = dict(cfg, train_steps=steps)
    for rank in range(cfg["topology"]["dp"]):
        with polyload.Loader(cfg, rank=rank) as loader:
            for b in loader:
                h = hashlib.sha256()
                for k in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens"):
                    h.update(b[k].numpy().tobytes())
                out.append(h.hexdigest())
    return out
