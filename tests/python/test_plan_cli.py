"""Iteration matches the CLI's plan: ``python -m polyload plan CONFIG --steps 0:3 --json``
lists, per (step, dp_rank), the sequences of each micro-batch and their chunks; the
micro-batches that polyload.Loader yields for that rank hold exactly those chunks' tokens
(read independently through ``polyload._core.Source``), then padding, with the plan's
segment boundaries.  (test_loader.py checks the Loader against the in-process Planner; this
checks it against the CLI, which users and the Ray deployment see.)"""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

import fortunes_corpus
import polyload
from polyload import _core

pytest.importorskip("torch")

STEPS = 3


def cli_plan(config_path, steps, rank=None):
    cmd = [sys.executable, "-m", "polyload", "plan", str(config_path), "--steps", f"0:{steps}",
           "--json"]
    if rank is not None:
        cmd += ["--rank", str(rank)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def check_loader_against_plan(cfg_dict, tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(cfg_dict))
    lines = cli_plan(path, STEPS)
    dp = cfg_dict["topology"]["dp"]
    assert [(ln["step"], ln["dp_rank"]) for ln in lines] == [
        (s, r) for s in range(STEPS) for r in range(dp)]

    cfg = _core.Config.parse_file(str(path))
    sources = {cfg.source_name(i): cfg.open_source(i) for i in range(cfg.num_sources)}
    S, rows, pad = cfg_dict["seq_length"], cfg_dict["micro_batch_size"], cfg_dict.get("pad_id", 0)
    nmb = cfg_dict["global_batch_size"] // (dp * rows)
    ranks = list(range(dp))  # tp = pp = cp = 1: global rank r is DP rank r
    n_checked = 0
    with polyload.Loader(cfg_dict, rank=0, ranks=ranks) as loader:
        for line in lines:
            by_mb = collections.defaultdict(list)
            for seq in line["sequences"]:
                by_mb[seq["micro_batch"]].append(seq)
            assert sorted(by_mb) == list(range(nmb))
            for mb in range(nmb):
                batch = loader.next_batch(line["dp_rank"])
                ids = batch["input_ids"].numpy()
                assert ids.shape == (rows, S) and len(by_mb[mb]) == rows
                cu = [0]
                for row, seq in enumerate(by_mb[mb]):
                    want = [np.asarray(sources[src].read(index, offset, length), dtype=np.int64)
                            for src, index, offset, length in seq["chunks"]]
                    want = np.concatenate(want) if want else np.zeros(0, np.int64)
                    assert want.size <= S
                    where = f"step {line['step']} dp_rank {line['dp_rank']} mb {mb} row {row}"
                    np.testing.assert_array_equal(ids[row, :want.size], want, err_msg=where)
                    assert (ids[row, want.size:] == pad).all(), where
                    cu += [row * S + c for c in seq["cu_seqlens"][1:]]
                    n_checked += 1
                np.testing.assert_array_equal(batch["cu_seqlens"].numpy(), cu)
        for r in ranks:  # the plan covered everything the loader built for these steps
            assert loader.next_batch(r) is not None
    assert n_checked == STEPS * cfg_dict["global_batch_size"]
    return path, lines


def test_loader_matches_cli_plan_synthetic(corpus, tmp_path):
    """Token value == position in the source: any misplaced token shows."""
    check_loader_against_plan(corpus.config(train_steps=10, balance="greedy",
                                            cost={"preset": "causal"}), tmp_path)


def test_loader_matches_cli_plan_real_text(tmp_path_factory, tmp_path):
    fc = fortunes_corpus.build(tmp_path_factory.mktemp("fortunes"))
    path, lines = check_loader_against_plan(
        fortunes_corpus.config(fc, balance="karmarkar_karp", topology={"dp": 2}), tmp_path)
    # --rank R gives the same plan lines for that rank's DP index, plus its role
    for line in cli_plan(path, STEPS, rank=1):
        assert line["dp_rank"] == 1 and line["pp_rank"] == line["cp_rank"] == line["tp_rank"] == 0
        want = next(x for x in lines if x["step"] == line["step"] and x["dp_rank"] == 1)
        assert line["sequences"] == want["sequences"]
