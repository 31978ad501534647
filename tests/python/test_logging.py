"""The Python loader logs through ``logging`` under the logger ``polyload``: config
warnings at WARNING (and still as ConfigWarning), the Loader's rank and sources, state
loads, evaluation passes and the end of data at INFO; nothing reaches stderr through
logging's last-resort handler when the application configured no logging."""

import logging
import subprocess
import sys
import warnings

import pytest
import yaml

import polyload
from polyload import ConfigWarning


@pytest.fixture(autouse=True)
def _no_world(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)


def test_loader_logs(corpus, caplog):
    cfg = corpus.config(train_steps=2, split="8,1,1")
    cfg["sources"][0]["weight"] = 2.0  # weights no longer sum to 1: a config warning
    caplog.set_level(logging.INFO, logger="polyload")
    with pytest.warns(ConfigWarning, match="normalized"):
        loader = polyload.Loader(cfg, rank=0, ranks=[0, 1])
    with loader:
        recs = [r for r in caplog.records if r.name == "polyload"]
        warn = [r for r in recs if r.levelno == logging.WARNING]
        assert len(warn) == 1 and "normalized" in warn[0].getMessage()
        info = [r.getMessage() for r in recs if r.levelno == logging.INFO]
        assert any("rank 0 (dp 0, pp 0, cp 0, tp 0) of world 2" in m and "s0, s1, s2" in m
                   for m in info)
        sd = loader.state_dict()
        list(loader)
        assert any("reached the end of its data" in r.getMessage() for r in caplog.records)
        caplog.clear()
        loader.load_state_dict(sd)
        assert any("resumes at step 0, micro-batch 0" in r.getMessage()
                   for r in caplog.records)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigWarning)
            with loader.eval_iter("valid", steps=1):
                pass
        assert any("evaluation pass over the valid data (1 steps)" in r.getMessage()
                   for r in caplog.records)


def test_no_output_without_logging_config(corpus, tmp_path):
    """Without a logging configuration, the INFO records go nowhere and the config warning
    is printed once (by the warnings module), not a second time by logging."""
    cfg = corpus.config(train_steps=1)
    cfg["sources"][0]["weight"] = 2.0
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = ("import polyload\n"
            f"with polyload.Loader({str(path)!r}, rank=0) as l: list(l)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("normalized") == 1, r.stderr
    assert "Loader: rank" not in r.stderr
