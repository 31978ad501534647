"""A source loader of a Ray deployment reading remote sources is killed mid-run: its
standby (or its restart) opens the same objects through the node's cache, and every
rank's batches still equal the embedded loader's on the files on disk."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from s3_fixtures import s3env, s3_environ  # noqa: F401  (fixtures)
from test_remote_sources import _hashes, _remote_cfg, remote_corpus  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_killed_source_loader_on_remote_sources(remote_corpus, s3_environ, tmp_path):
    pytest.importorskip("ray")
    steps = 8
    cfg = _remote_cfg(remote_corpus, tmp_path / "node-cache", train_steps=steps,
                      topology={"dp": 2})
    want = {str(r): _hashes(remote_corpus.config(train_steps=steps, topology={"dp": 2}),
                            rank=r) for r in (0, 1)}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out.json"
    n_mb = len(want["0"])
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "remote", "ray_run.py"),
                        str(path), "2", str(out), str(n_mb // 3)], env=s3_environ,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got.pop("killed") == 1  # the kill happened, mid-run
    assert got == want
