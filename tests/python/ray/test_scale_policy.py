"""The autoscaling policy alone (polyload.ray._scale_policy.ScalePolicy), without Ray:
the feed-forward size follows the policy's formula and grows before the schedule moves
weight, pools shrink one loader at a time after the down-scale delay, feedback adds one
loader to the busiest pool, bounds and the CPU budget hold; and the routing table
(polyload.ray._routing.RoutingTable) refuses tables that lose or repeat a document.
Neither module imports Ray: a subprocess with Ray blocked from import runs them."""

import math
import os
import subprocess
import sys

import pytest

from polyload.ray import _scale_policy as _scale
from polyload.ray._routing import RoutingTable, split_ranges


def test_policy_and_routing_import_no_ray():
    """polyload.ray, its policy, routing table, registry and protocol import (and the
    policy decides) with Ray blocked from import, and importing polyload.ray sets no
    environment variable."""
    code = """
import os, sys
sys.modules["ray"] = None  # any import of ray raises ImportError
env = dict(os.environ)
import polyload.ray as pr
from polyload.ray import _scale_policy as sp
from polyload.ray._routing import RoutingTable
from polyload.ray import _protocol, _registry  # noqa: F401
assert "ray" not in [m for m, v in sys.modules.items() if v is not None]
assert dict(os.environ) == env, "importing polyload.ray changed the environment"
p = sp.ScalePolicy(["a", "b"], lambda s, t: 0.5, 1024.0, sp.autoscale_options({}))
t, d = p.decide(0.0, 0, 0.5, 0.0, [sp.SourceView(1e-3, 0.9, 0), sp.SourceView(None, 0.0, 0)],
                {}, 100)
assert t == [2, 0], t  # need 0.5 x 1024 x 1e-3 / 0.5 x 1.1 = 1.13 loaders
RoutingTable(["a"], [["a", 0, 4, 0]], [["x"]], "ns").check([4])
assert pr.ScalePolicy is sp.ScalePolicy and pr.AUTOSCALE_DEFAULTS is sp.DEFAULTS
try:
    pr.Client
except ImportError:
    pass
else:
    raise AssertionError("polyload.ray.Client imported without Ray")
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def schedule(step):
    """Weights of three sources: the costly third one goes from 0.1 to 0.6 at step 50."""
    return [0.8, 0.1, 0.1] if step < 50 else [0.3, 0.1, 0.6]


def policy(**opts):
    o = _scale.autoscale_options(opts)
    return _scale.ScalePolicy(["tok", "text", "img"], lambda s, t: schedule(t)[s],
                              tokens_per_step=8 * 1024, options=o)


def views(costs, loaders, util=0.6):
    return [_scale.SourceView(c, util, n) for c, n in zip(costs, loaders)]


COSTS = [1e-8, 2e-4, 1e-3]  # CPU-seconds per token


def test_feed_forward_formula_and_ahead_of_the_schedule():
    p = policy(horizon_steps=8, headroom=0.1, loader_cpus=1.0, max_loaders=64)
    step_time = 0.5
    target, dec = p.decide(0.0, 10, step_time, 0.0, views(COSTS, [0, 0, 0]), {}, 100)
    need_img = 0.1 * 8192 * 1e-3 / (1.0 * step_time) * 1.1   # 1.80 loaders
    need_text = 0.1 * 8192 * 2e-4 / step_time * 1.1          # 0.36: stays packed
    assert target == [0, 0, math.ceil(need_img)] == [0, 0, 2]
    assert need_text < 0.5
    assert all(d["reason"].startswith("feed-forward") for d in dec)
    # 8 steps before the change (H = 8) the pool is sized for the new weight
    cur = target
    target, dec = p.decide(1.0, 42, step_time, 0.0, views(COSTS, cur), {}, 100)
    assert target[2] == math.ceil(0.6 * 8192 * 1e-3 / step_time * 1.1) == 11
    assert "0.600 at step 50" in next(d for d in dec if d["source"] == "img")["reason"]
    # 9 steps before: not yet
    p2 = policy(horizon_steps=8, max_loaders=64)
    t2, _ = p2.decide(0.0, 41, step_time, 0.0, views(COSTS, cur), {}, 100)
    assert t2[2] == cur[2]


def test_down_scale_waits_and_goes_one_at_a_time():
    p = policy(down_delay_s=10.0, max_loaders=64)
    cur = [0, 0, 10]
    t, dec = p.decide(0.0, 10, 0.5, 0.0, views(COSTS, cur, util=0.2), {}, 100)
    assert t[2] == 10 and not [d for d in dec if d["source"] == "img"]
    t, dec = p.decide(5.0, 11, 0.5, 0.0, views(COSTS, cur, util=0.2), {}, 100)
    assert t[2] == 10
    t, dec = p.decide(10.5, 12, 0.5, 0.0, views(COSTS, cur, util=0.2), {}, 100)
    assert t[2] == 9 and dec[-1]["reason"].startswith("down after")
    # an empty queue (nothing built ahead of the trainers) holds the pool
    p = policy(down_delay_s=0.0, max_loaders=64)
    t, _ = p.decide(0.0, 10, 0.5, 0.0, views(COSTS, cur, util=0.2), {}, 100, queue_steps=0)
    assert t[2] == 10
    t, _ = p.decide(0.0, 10, 0.5, 0.0, views(COSTS, cur, util=0.2), {}, 100, queue_steps=3)
    assert t[2] == 9
    # a busy pool does not shrink even when the formula says so
    p = policy(down_delay_s=0.0, max_loaders=64)
    t, _ = p.decide(0.0, 10, 0.5, 0.0, views(COSTS, cur, util=0.9), {}, 100)
    assert t[2] == 10


def test_down_scale_keeps_a_margin_so_a_wavering_cost_does_not_flap():
    """A need just under a whole number of loaders (the cost measured a little lower)
    does not shrink the pool unless one loader fewer holds it with ``down_margin``."""
    step_time = 0.5

    def need(c):  # img at step 10 (weight 0.1), headroom 0.1
        return 0.1 * 8192 * c / step_time * 1.1

    near, far = 0.9 / need(1.0), 0.75 / need(1.0)  # costs giving needs 0.9 and 0.75
    assert need(near) == pytest.approx(0.9) and need(far) == pytest.approx(0.75)
    p = policy(down_delay_s=0.0, down_margin=0.2, max_loaders=64)
    cost = [COSTS[0], COSTS[1], near]
    for t in range(5):  # need 0.9: ceil 1 < 2 loaders, but 0.9 x 1.2 > 1: held
        target, dec = p.decide(float(t), 10 + t, step_time, 0.0, views(cost, [0, 0, 2], 0.2),
                               {}, 100)
        assert target[2] == 2 and not [d for d in dec if d["source"] == "img"]
    target, dec = p.decide(6.0, 16, step_time, 0.0,
                           views([COSTS[0], COSTS[1], far], [0, 0, 2], 0.2), {}, 100)
    assert target[2] == 1  # 0.75 x 1.2 = 0.9 <= 1: shrinks
    assert next(d for d in dec if d["source"] == "img")["reason"].startswith("down after")
    # with no margin the first need under 1 shrinks it
    p0 = policy(down_delay_s=0.0, down_margin=0.0, max_loaders=64)
    target, _ = p0.decide(0.0, 10, step_time, 0.0, views(cost, [0, 0, 2], 0.2), {}, 100)
    assert target[2] == 1


def test_down_margin_at_the_packing_edge_with_bias_and_bounds():
    """The margin also holds the last dedicated loader while the need with it reaches
    ``pack_below``; the feedback bias counts as a loader the margin cannot use; a pool
    above ``max_loaders`` shrinks whatever the need."""
    step_time = 0.5
    per = 0.1 * 8192 / step_time * 1.1  # img's need per unit of cost at step 10

    def decide(p, need, cur, t=0.0):
        cost = [COSTS[0], COSTS[1], need / per]
        return p.decide(t, 10, step_time, 0.0, views(cost, [0, 0, cur], 0.2), {}, 100)[0][2]

    p = policy(down_delay_s=0.0, down_margin=0.2, max_loaders=64)
    assert decide(p, 0.45, 1) == 1 and p.held_by_margin == {2}  # 0.54 >= pack_below 0.5
    assert decide(p, 0.35, 1) == 0 and not p.held_by_margin     # 0.42: packed again
    p = policy(down_delay_s=0.0, down_margin=0.2, max_loaders=64)
    p.bias[2] = 1  # want = ceil(need) + 1 = 2 < 3, but 3 - 1 - bias = 1 loader left
    assert decide(p, 0.9, 3) == 3
    assert decide(p, 0.8, 3) == 2  # 0.96 <= 1
    p = policy(down_delay_s=0.0, down_margin=0.2, max_loaders={"img": 2})
    assert decide(p, 4.5, 5) == 4  # above max_loaders: down, one at a time


def test_cpu_budget_cuts_a_pool_held_by_the_margin_before_a_growing_one():
    step_time = 0.5
    per = 0.1 * 8192 / step_time * 1.1
    p = policy(down_delay_s=0.0, down_margin=0.2, max_loaders=64)
    cost = [COSTS[0], 1.5 / per, 0.9 / per]  # text needs 1.5 (2 loaders), img 0.9 held at 2
    target, dec = p.decide(0.0, 10, step_time, 0.0, views(cost, [0, 1, 2], 0.2), {}, 3)
    assert target == [0, 2, 1]
    assert "limited by cpu_budget=3" in next(d for d in dec if d["source"] == "img")["reason"]


def test_cpu_budget_keeps_the_formula_before_feedback_and_small_pools():
    """Within a budget of 2 loaders: a pool the formula sizes at 2 keeps them; a loader
    that feedback added to a pool needing 0.29 goes first, and a pool needing 0.6 (over
    pack_below, under one loader) goes back to the shared loaders before the big pool
    is cut (bench round s30a-0: the budget cut img, need 1.27, to one loader and kept a
    feedback loader for docs, and the trainers waited)."""
    step_time = 0.5
    per = 0.1 * 8192 / step_time * 1.1  # tokens x (1 + headroom) per CPU-s of text/img
    p = policy(max_loaders=64)
    p.bias[1] = 1  # feedback gave text a loader earlier
    cost = [COSTS[0], 0.29 / per, 1.27 / per]
    target, dec = p.decide(0.0, 10, step_time, 0.0, views(cost, [0, 1, 2], 0.9), {}, 2)
    assert target == [0, 0, 2]
    assert "limited by cpu_budget=2" in next(d for d in dec if d["source"] == "text")["reason"]
    p = policy(max_loaders=64)
    cost = [COSTS[0], 0.6 / per, 1.49 / per]  # text 1 loader, img 2: one too many
    target, dec = p.decide(0.0, 10, step_time, 0.0, views(cost, [0, 0, 0], 0.9), {}, 2)
    assert target == [0, 0, 2]
    # without the budget both get what the formula says
    target, _ = p.decide(1.0, 10, step_time, 0.0, views(cost, [0, 0, 0], 0.9), {}, 100)
    assert target == [0, 1, 2]


def test_feedback_adds_one_loader_to_the_busiest_pool():
    p = policy(cooldown_s=2.0, max_loaders=64)
    sized, _ = p.decide(0.0, 10, 0.5, 0.0, views(COSTS, [0, 0, 0]), {}, 100)
    vs = [_scale.SourceView(c, u, n) for c, u, n in zip(COSTS, [0.1, 0.7, 0.95], sized)]
    t, dec = p.decide(1.0, 11, 0.5, 0.2, vs, {}, 100)
    assert t[2] == sized[2] + 1 and t[1] == sized[1]
    assert dec[0]["reason"].startswith("feedback: trainers waited 20.0%")
    t2, dec2 = p.decide(2.0, 12, 0.5, 0.2, [_scale.SourceView(c, u, n) for c, u, n in
                                          zip(COSTS, [0.1, 0.7, 0.95], t)], {}, 100)
    assert t2 == t and not dec2  # cooldown: one change per cooldown_s


def test_bounds_budget_and_pins():
    p = policy(min_loaders={"tok": 1}, max_loaders={"img": 3}, loader_cpus=1.0)
    t, _ = p.decide(0.0, 60, 0.1, 0.0, views(COSTS, [0, 0, 0]), {}, 100)
    assert t[0] == 1 and t[2] == 3
    p = policy(max_loaders=64)
    t, dec = p.decide(0.0, 60, 0.1, 0.0, views(COSTS, [0, 0, 0]), {}, 10)
    assert sum(t) <= 10 and any("cpu_budget=10" in d["reason"] for d in dec)
    t, _ = p.decide(1.0, 60, 0.1, 0.0, views(COSTS, t), {2: 2}, 100)
    assert t[2] == 2
    with pytest.raises(ValueError, match="unknown keys"):
        _scale.autoscale_options({"nope": 1})
    with pytest.raises(ValueError, match="min_loaders"):
        policy(min_loaders={"img": 5}, max_loaders={"img": 2})


def test_unmeasured_sources_stay():
    p = policy()
    t, dec = p.decide(0.0, 10, None, 0.0, views([None, None, None], [0, 1, 2]), {}, 100)
    assert t == [0, 1, 2] and dec == []


def _table(partitions, **kw):
    return RoutingTable(sources=["a", "b"], partitions=partitions, slots=[["x"], ["y"]],
                        namespace="ns", **kw)


def test_routing_tables_cover_every_document_once():
    ok = [["a", 0, 5, 0], ["a", 5, 10, 1], ["b", 0, 3, 1]]
    _table(ok).check([10, 3])
    gap = [["a", 0, 4, 0], ["a", 5, 10, 1], ["b", 0, 3, 1]]
    with pytest.raises(ValueError, match="source a: documents 4..5 are owned by nobody"):
        _table(gap).check([10, 3])
    twice = [["a", 0, 6, 0], ["a", 5, 10, 1], ["b", 0, 3, 1]]
    with pytest.raises(ValueError, match="owned twice"):
        _table(twice).check([10, 3])
    short = [["a", 0, 10, 0], ["b", 0, 2, 1]]
    with pytest.raises(ValueError, match="source b: documents 2..3"):
        _table(short).check([10, 3])
    with pytest.raises(ValueError, match="bad partition"):
        _table([["a", 0, 10, 7]]).check([10, 3])
    with pytest.raises(ValueError, match="on retired slot 1"):
        _table(ok, retired=[1]).check([10, 3])
    assert split_ranges(10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert split_ranges(2, 5) == [(0, 1), (1, 2)]
    assert split_ranges(0, 3) == [(0, 0)]


def test_routing_table_views():
    """What each role reads of a table: the slots of a source, each slot's partitions,
    the owner of each document, and launch's partitions."""
    from polyload.ray._routing import key_index, launch_partitions

    t = RoutingTable(sources=["a", "b"], slots=[["x", "x.shadow.0"], ["y"], ["z"]],
                     namespace="ns", version=3, retired=[2],
                     partitions=[["a", 5, 10, 1], ["a", 0, 5, 0], ["b", 0, 3, 1]])
    assert t.dedicated == [None, None, None] and t.source_loaders == ["x", "y", "z"]
    assert t.live_slots() == [0, 1] and t.slots_of(0) == [0, 1] and t.slots_of(1) == [1]
    assert t.slot_shards() == [[(0, 0, 5)], [(0, 5, 10), (1, 0, 3)], []]
    assert t.owner_of(0, [0, 4, 5, 9]).tolist() == [0, 0, 1, 1]
    starts, owners = key_index(t.for_constructors()[0])
    assert starts.tolist() == [0, 5, 1 << 40] and owners.tolist() == [0, 1, 1]
    assert launch_partitions(["a", "b"], [10, 1], {"a": 3}) == \
        [(0, 0, 3), (0, 3, 7), (0, 7, 10), (1, 0, 1)]
    assert launch_partitions(["a", "b"], [10, 1], 2) == [(0, 0, 5), (0, 5, 10), (1, 0, 1)]
    with pytest.raises(ValueError, match="unknown sources"):
        launch_partitions(["a"], [10], {"c": 2})


def test_feedback_bias_counts_once():
    """A need under pack_below and trainers waiting: feedback gives the source one
    loader, and the next decision keeps it at one (the bias is added after packing and
    rounding, not before)."""
    costs = [1e-8, 2e-4, 2.0e-4]  # img needs 0.1 * 8192 * 2e-4 / 0.5 * 1.1 = 0.36 loaders
    p = policy(cooldown_s=100.0, max_loaders=64)
    vs = [_scale.SourceView(c, u, n) for c, u, n in zip(costs, [0.1, 0.2, 0.9], [0, 0, 0])]
    t, dec = p.decide(0.0, 10, 0.5, 0.3, vs, {}, 100)
    assert t == [0, 0, 1] and dec[0]["reason"].startswith("feedback")
    vs = [_scale.SourceView(c, u, n) for c, u, n in zip(costs, [0.1, 0.2, 0.9], t)]
    t2, dec2 = p.decide(1.0, 11, 0.5, 0.0, vs, {}, 100)
    assert t2 == [0, 0, 1] and not dec2


def test_horizon_reaches_past_the_planning_frontier():
    """Raw text is tokenized when its step is planned: with the planner 10 steps ahead
    of the trainers, a change 15 steps away is within reach of H = 8."""
    p = policy(horizon_steps=8, max_loaders=64)
    t, _ = p.decide(0.0, 35, 0.5, 0.0, views(COSTS, [0, 0, 2]), {}, 100)
    assert t[2] == 2  # step 35: the change at 50 is beyond 35 + 8
    t, dec = p.decide(0.0, 35, 0.5, 0.0, views(COSTS, [0, 0, 2]), {}, 100, ahead=10)
    assert t[2] == 11 and "at step 50" in dec[0]["reason"]


def test_constructor_routing_skips_retired_slots():
    table = RoutingTable(sources=["a", "b"], slots=[["x"], ["y", "y.shadow.0"], ["z"]],
                         namespace="ns", retired=[2],
                         partitions=[["a", 5, 10, 1], ["a", 0, 5, 0], ["b", 0, 3, 1]])
    routing, names = table.for_constructors()
    assert routing == [([0, 5], [0, 1]), ([0], [1])]
    assert names == [["x"], ["y", "y.shadow.0"], []]


def test_feedback_held_when_the_loaders_are_starved_of_cpu():
    """Trainers wait and the pool is busy, but its loaders get 0.2 CPU each: the nodes
    are saturated, so no loader is added and the decision held is logged with why."""
    p = policy(cooldown_s=0.0, max_loaders=64)
    sized, _ = p.decide(0.0, 10, 0.5, 0.0, views(COSTS, [0, 0, 0]), {}, 100)
    vs = [_scale.SourceView(c, u, n, r) for c, u, n, r in
          zip(COSTS, [0.1, 0.7, 0.95], sized, [0.1, 0.2, 0.2])]
    t, dec = p.decide(1.0, 11, 0.5, 0.3, vs, {}, 100)
    assert t == sized and not dec
    assert p.held and "saturated" in p.held[0]["reason"] and p.held[0]["source"] == "img"
    vs = [_scale.SourceView(c, u, n, r) for c, u, n, r in
          zip(COSTS, [0.1, 0.7, 0.95], sized, [0.1, 0.2, 0.9])]
    t, dec = p.decide(2.0, 12, 0.5, 0.3, vs, {}, 100)
    assert t[2] == sized[2] + 1 and dec[0]["reason"].startswith("feedback")


def test_cost_after_a_change_waits_for_min_samples():
    """A pool change clears a source's cost samples; the cost from before the change
    stays in use until min_samples samples of the new count are in (one outlier right
    after a new loader starts must not size the next decision), then only the new
    samples count; a source never measured uses its first sample at once."""
    s = _scale._Samples(2, keep=7, min_new=3)
    assert s.median(0) is None and not s.has(0)
    s.append(1, 5.0)
    assert s.median(1) == 5.0  # nothing held: the first sample is the cost
    for v in (1.0, 1.2, 0.9):
        s.append(0, v)
    assert s.median(0) == 1.0
    s.clear(0)
    assert s.has(0) and s.median(0) == 1.0  # held
    s.append(0, 9.0)  # the new loader's start-up
    assert s.median(0) == 1.0
    s.append(0, 2.0)
    assert s.median(0) == 1.0
    s.append(0, 2.2)
    assert s.median(0) == 2.2  # median of 9.0, 2.0, 2.2: the new count's
    s.clear(0)
    assert s.median(0) == 2.2
    s.append(0, 50.0)  # one outlier, then another change: 2.2 stays held
    s.clear(0)
    assert s.median(0) == 2.2
    with pytest.raises(ValueError, match="min_samples"):
        _scale.autoscale_options({"min_samples": 0})
    with pytest.raises(ValueError, match="min_samples"):
        _scale.autoscale_options({"min_samples": 8})


def test_wait_fraction_of_a_look_without_a_step_is_no_stall():
    """Looks (every interval_s) are shorter than a step: one in which no step finished
    and the ranks waited a few milliseconds is no evidence (in a measured run such a
    look read as "trainers waited 100 %", feedback took a loader and the budget cut
    the image pool); the trainers standing at one step for over two step times while
    waiting is a stall."""
    wf = _scale.wait_fraction
    # steps finished: the mean rank's wait per step over the step (0.5 s, 25 ms waited)
    assert wf(1.0, 2, 0.05, 0.0, 0.5) == pytest.approx(0.05)
    assert wf(0.5, 1, 0.6, 0.0, 0.5) == 1.0  # capped
    # no step in a 0.5 s look of a 0.53 s step: 3 ms waited is not a stall
    assert wf(0.5, 0, 0.003, 0.4, 0.53) == 0.0
    assert wf(0.5, 0, 0.003, 0.9, 0.53) == 0.0  # under two step times
    # standing for 1.2 s (over 2 x 0.53) and waiting: a stall
    assert wf(0.5, 0, 0.5, 1.2, 0.53) == 1.0
    # standing without waiting: the trainers compute (a long step), no stall
    assert wf(0.5, 0, 0.0, 5.0, 0.53) == 0.0
    # step time unknown yet: no judgement
    assert wf(0.5, 0, 0.5, 5.0, None) == 0.0
