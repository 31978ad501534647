"""``polyload report``: its numbers against ``polyload plan --json`` (the C CLI) and the
config's schedule, and the HTML / PNG files it writes."""

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

import polyload
from polyload import report

pytest.importorskip("matplotlib")


def _cfg(corpus):
    return corpus.config(
        topology={"dp": 2}, train_steps=None, balance="greedy", cost={"preset": "causal"},
        schedule={"interpolation": "linear", "points": [
            {"step": 0, "weights": {"s0": 0.7, "s1": 0.1, "s2": 0.2}},
            {"step": 10, "weights": {"s0": 0.2, "s1": 0.4, "s2": 0.4}}]})


def _write_yaml(cfg, path):
    import yaml

    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(path)


def _plan_lines(path, a, b):
    out = subprocess.run([sys.executable, "-m", "polyload", "plan", path, "--steps", f"{a}:{b}",
                          "--json"], capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_numbers_match_plan_json(corpus, tmp_path):
    cfg = _cfg(corpus)
    path = _write_yaml(cfg, tmp_path / "mix.yaml")
    a, b = 3, 14
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = report.collect(path, a, b)
    assert data["steps"] == list(range(a, b))
    lines = _plan_lines(path, a, b)
    names = data["sources"]
    S, G = corpus.seq_length, 8
    core_cfg = polyload._make_config(path)
    for k, step in enumerate(range(a, b)):
        mine = [ln for ln in lines if ln["step"] == step]
        assert len(mine) == 2
        per = np.zeros(3, dtype=np.int64)
        for ln in mine:
            for seq in ln["sequences"]:
                for src, _idx, _off, length in seq["chunks"]:
                    per[names.index(src)] += length
        assert data["tokens"][k] == per.tolist()
        assert data["padding_fraction"][k] == pytest.approx(1 - per.sum() / (S * G))
        np.testing.assert_allclose(data["realized"][k], per / per.sum())
        assert data["scheduled"][k] == [core_cfg.source_weight(i, step) for i in range(3)]
        # Balance: the largest rank cost over a bound it can never beat; the bound is at
        # least the mean rank cost (total / dp).
        worst = max(ln["rank_cost"] for ln in mine)
        total = sum(ln["rank_cost"] for ln in mine)
        bound = worst / data["max_over_lower_bound"][k]
        assert total / 2 - 1e-6 <= bound <= worst + 1e-6
        # Mixture deviation and the chunk-bound flag, as the plan's JSON says them.
        dev = max(abs(r - w) for r, w in zip(data["realized"][k], data["scheduled"][k]))
        assert data["mixture_deviation"][k] == pytest.approx(dev)
        assert mine[0]["step_mixture_deviation"] == pytest.approx(dev, abs=1e-9)
        assert data["bound_by_chunk"][k] == mine[0]["step_bound_by_chunk"]
        assert mine[0]["step_lower_bound"] == pytest.approx(
            max(total / 2, mine[0]["step_costliest_chunk"]))
    # Cumulative fractions: token-weighted over the range.
    tok = np.asarray(data["tokens"], dtype=np.float64)
    np.testing.assert_allclose(data["cumulative_realized"][-1], tok.sum(0) / tok.sum())
    sched = np.asarray(data["scheduled"])
    np.testing.assert_allclose(data["cumulative_scheduled"][-1],
                               (sched * tok.sum(1, keepdims=True)).sum(0) / tok.sum())
    # The largest-deficit rule keeps the realized mixture close to the schedule.
    np.testing.assert_allclose(data["cumulative_realized"][-1],
                               data["cumulative_scheduled"][-1], atol=0.05)
    # Epochs grow, and s1 (61 short documents, weight up to 0.4) is read more than once.
    ep = np.asarray(data["epochs"])
    assert np.all(np.diff(ep, axis=0) >= 0)
    assert ep[-1][1] > 1.0


def test_html_png_and_cli(corpus, tmp_path):
    path = _write_yaml(_cfg(corpus), tmp_path / "mix.yaml")
    out = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "polyload", "report", path, "--steps", "0:6",
                        "--out", str(out), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["steps"] == list(range(6))
    text = out.read_text()
    assert "<h1>polyload report, steps 0:6</h1>" in text
    assert 'src="data:image/png;base64,' in text
    embedded = text.split('id="polyload-report-data">')[1].split("</script>")[0]
    assert json.loads(embedded) == data
    for name in ("s0", "s1", "s2"):
        assert f"<td>{name}</td>" in text
    png = tmp_path / "report.png"
    r = subprocess.run([sys.executable, "-m", "polyload", "report", path, "--steps", "2:5",
                        "--out", str(png)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Usage and config errors exit 2 with a message.
    for args, msg in ((["--steps", "5:2", "--json"], "0 <= A < B"),
                      (["--steps", "x", "--json"], "--steps wants A:B"),
                      (["--steps", "0:2", "--out", "r.pdf"], ".html or .png"),
                      (["--steps", "0:2"], "give --out")):
        r = subprocess.run([sys.executable, "-m", "polyload", "report", path] + args,
                           capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)
