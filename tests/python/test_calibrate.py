"""polyload.calibrate: the synthetic micro-batches, the timing rows and the fit."""

from __future__ import annotations

import pytest
import yaml

torch = pytest.importorskip("torch")

import polyload  # noqa: E402
from polyload import _core  # noqa: E402
from polyload import calibrate as cal  # noqa: E402


def test_shapes_cover_tokens_and_spread_sum_sq():
    shapes = cal.micro_batches(1024, min_length=64)
    assert all(sum(s) in (1024, 256) for s in shapes)
    assert [1024] in shapes and [64] * 16 in shapes
    assert any(s[0] == 768 and all(x == 64 for x in s[1:]) for s in shapes)
    sq = {sum(x * x for x in s) for s in shapes if sum(s) == 1024}
    assert len(sq) >= 6  # b is told apart from a


def test_fit_recovers_known_costs_and_prints_a_config():
    a, b, c = 7e-7, 5e-11, 3e-4
    shapes = cal.micro_batches(32768, min_length=512)
    rows = [{"tokens": float(sum(s)), "sum_sq": float(sum(x * x for x in s)),
             "seconds": a * sum(s) + b * sum(x * x for x in s) + c} for s in shapes]
    f = cal.fit(rows)
    assert f["a"] == pytest.approx(a, rel=1e-6)
    assert f["b"] == pytest.approx(b, rel=1e-6)
    assert f["c"] == pytest.approx(c, rel=1e-5)
    assert f["r2"] == pytest.approx(1.0) and f["max_relative_error"] < 1e-6
    line = cal.cost_config(f, layers=16, head_a=3.5e-6, head_c=4e-4)
    cost = yaml.safe_load(line.split("#")[0])["cost"]
    assert cost["a"] == pytest.approx(16 * a + 3.5e-6, rel=1e-5)
    assert cost["b"] == pytest.approx(16 * b, rel=1e-5)
    assert cost["c"] == pytest.approx(16 * c + 4e-4, rel=1e-5)
    cfg = _core.Config.parse_string(
        line.split("#")[0] + "\nbalance: variable_length\n"
        "sources: [{name: a, type: megatron, path: x, weight: 1}]\n")
    assert cfg.get_int("balance") == 3


def test_measure_times_each_micro_batch():
    seen = []

    def step(b):
        cu = b["cu_seqlens"]
        seen.append((int(b["input_ids"].numel()), cu.tolist(), b["position_ids"].tolist()))
        w = torch.ones((), requires_grad=True)
        return w * b["loss_mask"].sum()

    shapes = [[8, 8], [16]]
    rows = cal.measure(step, shapes, vocab_size=50, repeats=2, warmup=1)
    assert [(r["tokens"], r["sum_sq"]) for r in rows] == [(16.0, 128.0), (16.0, 256.0)]
    assert all(r["seconds"] > 0 for r in rows)
    assert len(seen) == 6
    assert seen[0][1] == [0, 8, 16] and seen[0][2] == [list(range(8)) * 2]
