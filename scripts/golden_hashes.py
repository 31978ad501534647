#!/usr/bin/env python3
"""Hash what a polyload build produces, to show that a refactoring changed no byte.

Builds fixture corpora in a temporary directory (Megatron sources with the test suite's
token-equals-position layout, JSONL raw text with the built-in bytes tokenizer), then for
several configs (balance modes, packing modes, CP, DP) hashes every micro-batch of every
rank, the state blob after each step, and the plans of the first steps. Prints one JSON
object: {case: sha256}. Run it with two builds and compare the outputs:

    PL_CLI=build/polyload .venv/bin/python scripts/golden_hashes.py > after.json
    /path/to/other/.venv/bin/python scripts/golden_hashes.py > before.json
    diff before.json after.json
"""

import hashlib
import json
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

from conftest import Corpus, batch_hash  # noqa: E402

import polyload  # noqa: E402


def megatron_cfg(corpus, **over):
    cfg = {
        "seed": 11, "seq_length": corpus.seq_length, "global_batch_size": 8,
        "micro_batch_size": 2, "train_steps": 12, "dtype": "int64",
        "topology": {"dp": 2, "pp": 1, "cp": 1, "tp": 1},
        "threads": 2,
        "sources": [
            {"name": f"s{i}", "type": "megatron", "path": p, "weight": w}
            for i, (p, w) in enumerate(zip(corpus.prefixes, (0.5, 0.2, 0.3)))
        ],
    }
    cfg.update(over)
    return cfg


def text_cfg(path, **over):
    cfg = {
        "seed": 5, "seq_length": 96, "global_batch_size": 4, "micro_batch_size": 1,
        "train_steps": 8, "dtype": "int64", "topology": {"dp": 2},
        "threads": 2,
        "sources": [{"name": "t", "type": "jsonl", "path": path, "weight": 1.0,
                     "tokenizer": {"type": "bytes"}}],
    }
    cfg.update(over)
    return cfg


#: Keys added to batches and plans after the hashes were first recorded: reports that
#: carry no token (loss-token counts, the plan's per-step balance report). They are left
#: out so that the hashes keep comparing what the loader delivers.
ADDED_BATCH_KEYS = {"step_loss_tokens", "rank_loss_tokens", "non_padding_tokens"}
ADDED_PLAN_KEYS = {"step_lower_bound", "step_mean_rank_cost", "step_costliest_chunk",
                   "step_bound_by_chunk", "step_mixture_deviation"}


def run_case(cfg):
    """sha256 over every rank's micro-batches and the state blob after each step."""
    h = hashlib.sha256()
    world = cfg["topology"]["dp"] * cfg["topology"].get("cp", 1)
    with polyload.Loader(cfg, rank=0, ranks=list(range(world))) as ld:
        nmb = cfg["global_batch_size"] // (cfg["topology"]["dp"] * cfg["micro_batch_size"])
        for step in range(cfg["train_steps"]):
            for _ in range(nmb):
                for r in range(world):
                    b = ld.next_batch(r)
                    b = {k: v for k, v in b.items() if k not in ADDED_BATCH_KEYS}
                    h.update(batch_hash(b).encode())
            st = ld.state_dict()
            h.update(json.dumps(st, sort_keys=True, default=lambda b: bytes(b).hex()).encode())
    return h.hexdigest()


def plan_hash(cli, cfg, d, name):
    """sha256 of `polyload plan CONFIG --steps 0:N --json` (every rank's plans)."""
    import subprocess

    import yaml

    path = os.path.join(d, name + ".yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    h = hashlib.sha256()
    for r in range(cfg["topology"]["dp"]):
        p = subprocess.run([cli, "plan", path, "--steps", "0:%d" % cfg["train_steps"],
                            "--rank", str(r), "--json"], capture_output=True, check=True)
        for line in p.stdout.splitlines():
            rec = json.loads(line)
            for k in ADDED_PLAN_KEYS:
                rec.pop(k, None)
            h.update(json.dumps(rec, sort_keys=True).encode())
    return h.hexdigest()


def main():
    out = {}
    # A fixed directory: source paths are part of the config's fingerprint in the state.
    d = os.environ.get("PL_GOLDEN_DIR", os.path.join(tempfile.gettempdir(), "polyload_golden"))
    import shutil

    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    if True:
        corpus = Corpus(os.path.join(d), seq_length=64)
        cases = {
            "megatron_none": megatron_cfg(corpus, balance="none"),
            "megatron_greedy": megatron_cfg(corpus, balance="greedy"),
            "megatron_kk": megatron_cfg(corpus, balance="karmarkar_karp"),
            "megatron_concat": megatron_cfg(corpus, packing="concat_chunk"),
            "megatron_truncate": megatron_cfg(corpus, long_documents="truncate"),
            "megatron_cp2": megatron_cfg(corpus, topology={"dp": 2, "cp": 2, "pp": 1, "tp": 1}),
            "megatron_schedule": megatron_cfg(corpus, schedule={"points": [
                {"step": 0, "weights": {"s0": 0.7, "s1": 0.2, "s2": 0.1}},
                {"step": 12, "weights": {"s0": 0.1, "s1": 0.2, "s2": 0.7}}]}),
        }
        rng = np.random.default_rng(3)
        jl = os.path.join(d, "t.jsonl")
        with open(jl, "w") as f:
            for i in range(300):
                n = int(rng.integers(1, 200))
                f.write(json.dumps({"text": "".join(chr(97 + (i + k) % 26) for k in range(n))})
                        + "\n")
        cases["jsonl_bytes"] = text_cfg(jl)
        cases["jsonl_bytes_kk"] = text_cfg(jl, balance="karmarkar_karp")
        cli = os.environ.get("PL_CLI")  # a build's C CLI (build/polyload): plans too
        for name, cfg in cases.items():
            try:
                out[name] = run_case(cfg)
                if cli:
                    out[name + ".plan"] = plan_hash(cli, cfg, d, name)
            except Exception as e:  # a case a build cannot run is reported, not hidden
                out[name] = f"error: {type(e).__name__}: {e}"
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
