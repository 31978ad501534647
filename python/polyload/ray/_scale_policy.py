"""The autoscaling policy: how many source loaders each source needs (:class:`ScalePolicy`)
and its pure helpers (:func:`autoscale_options`, :func:`wait_fraction`, the cost samples).
Pure Python over NumPy: it imports no Ray, so it is tested without it; the actor that
measures the deployment and applies the decisions is
``polyload.ray._autoscaler.Autoscaler``.  The policy:

* **Feed-forward**: loaders needed for source s over the next ``horizon_steps`` steps =
  max over k in [0, H] of weight_s(t+k) x tokens per step x cost_s / (loader_cpus x
  compute step time) x (1 + headroom), where cost_s is CPU-seconds per delivered token
  measured in the source loaders, and the compute step time is the measured step time
  less the trainers' data wait over the last 10 seconds (the autoscaler's
  ``_STEP_WINDOW_S``).  The
  maximum over the horizon makes pools grow *before* the schedule moves weight to them;
  they shrink only after ``down_delay_s`` below need, and only when one loader fewer
  still holds the need times ``1 + down_margin`` (so a measured cost that wavers around
  a whole number of loaders does not flap the pool).
* **Feedback** (Cachew's and Ray Data's rules): when trainers waited more than
  ``wait_high`` of the step, add one loader to the most utilized pool, one change per
  ``cooldown_s``, unless its loaders get under ``cpu_starved`` x ``loader_cpus`` CPU
  (the nodes are saturated: another loader would only compete; held and logged); a
  bias that decays when the pool is idle below ``util_low`` for ``down_delay_s``.  A
  pool shrinks only while the constructors' queue holds built steps (data is ahead of
  the trainers).  Costs are sampled only at a steady count
  (``steady_s`` after the source's last change) and the median of the last samples is
  used (outliers discarded); after a change the cost measured before it stays in use
  until ``min_samples`` samples of the new count are in.
* **Bounds**: per-source ``min_loaders`` / ``max_loaders`` and a global ``cpu_budget``.
  A source whose need is under ``pack_below`` loaders stays packed on the shared actors
  the deployment started with (hundreds of small sources on a few actors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

#: autoscale= keys of :func:`polyload.ray.launch` and their defaults
DEFAULTS: Dict[str, Any] = {
    "enabled": True,        # False: manual Deployment.scale only
    "interval_s": 1.0,      # seconds between decisions
    "horizon_steps": 8,     # H: steps ahead the feed-forward looks
    "headroom": 0.1,        # extra capacity over the computed need
    "loader_cpus": 1.0,     # CPUs one loader uses (its rate: CPU-seconds per second)
    "min_loaders": 0,       # per source (int or {name: n}); 0: may stay packed
    "max_loaders": 8,       # per source (int or {name: n})
    "cpu_budget": None,     # CPUs for all dedicated loaders (None: the cluster's CPUs)
    "pack_below": 0.5,      # a need under this many loaders stays on the shared actors
    "wait_high": 0.05,      # trainer wait (fraction of the step) that triggers feedback
    "util_low": 0.5,        # a pool's busy fraction under which it may shrink
    "down_delay_s": 10.0,   # seconds below need before a pool shrinks
    "down_margin": 0.2,     # a pool shrinks only if one loader fewer holds need x (1 + this)
    "cooldown_s": 2.0,      # seconds between feedback changes (one loader at a time)
    "steady_s": 2.0,        # seconds after a change before costs are sampled again
    "samples": 7,           # cost samples kept per source (the median is used)
    "min_samples": 3,       # samples of a new count before its cost replaces the last
    "cpu_starved": 0.5,     # loaders getting under this x loader_cpus: no feedback
    "placement": None,      # [Ray options, ...] for new loaders, in preference order
    "shadows": None,        # standbys per new loader (None: launch's shadows)
    "start_timeout_s": 120.0,  # deadline of a change's steps (start, drain of old reads)
}


def autoscale_options(value) -> Dict[str, Any]:
    """``launch(autoscale=...)``: True / a dict of :data:`DEFAULTS` keys -> options."""
    if value is True:
        value = {}
    if not isinstance(value, Mapping):
        raise ValueError(f"autoscale must be True or a dict, got {type(value).__name__}")
    unknown = set(value) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"autoscale: unknown keys {sorted(unknown)} (keys: {sorted(DEFAULTS)})")
    out = {**DEFAULTS, **value}
    for k in ("interval_s", "headroom", "loader_cpus", "down_delay_s", "down_margin",
              "cooldown_s",
              "steady_s", "pack_below", "wait_high", "util_low", "start_timeout_s",
              "cpu_starved"):
        if not (isinstance(out[k], (int, float)) and out[k] >= 0):
            raise ValueError(f"autoscale: {k} must be a number >= 0, got {out[k]!r}")
    if out["loader_cpus"] <= 0 or out["interval_s"] <= 0:
        raise ValueError("autoscale: loader_cpus and interval_s must be > 0")
    if int(out["horizon_steps"]) < 0:
        raise ValueError("autoscale: horizon_steps must be >= 0")
    if not (isinstance(out["min_samples"], int) and 1 <= out["min_samples"] <= int(out["samples"])):
        raise ValueError(f"autoscale: min_samples must be an integer in 1..samples "
                         f"({out['samples']}), got {out['min_samples']!r}")
    return out


def _per_source(value, names: Sequence[str], what: str) -> List[int]:
    if isinstance(value, Mapping):
        unknown = set(value) - set(names)
        if unknown:
            raise ValueError(f"autoscale: {what}: unknown sources {sorted(unknown)}")
        default = DEFAULTS[what]
        return [int(value.get(n, default)) for n in names]
    return [int(value)] * len(names)


class _Samples:
    """The last ``keep`` cost samples of every source, in one float64 array
    ``[sources, keep]`` (a ring per row) instead of a deque per source: what the
    autoscaler holds per source stays a few words however many sources there are.

    A change of a source's pool clears its samples, but the cost measured before it is
    held until ``min_new`` samples of the new count are in: a new loader's first looks
    (its start-up, cold caches, a take-over of partitions) are outliers that a single
    sample would hand to the next decision (Cachew and Ray Data measure only at a
    steady count and discard outliers)."""

    def __init__(self, n: int, keep: int, min_new: int = 1) -> None:
        self._buf = np.zeros((int(n), max(1, int(keep))), dtype=np.float64)
        self._count = np.zeros(int(n), dtype=np.int64)  # samples added since the clear
        self._held = np.full(int(n), np.nan)  # the median before the last clear
        self._min_new = max(1, min(int(min_new), self._buf.shape[1]))

    def append(self, s: int, value: float) -> None:
        k = self._buf.shape[1]
        self._buf[s, self._count[s] % k] = value
        self._count[s] += 1

    def clear(self, s: int) -> None:
        # a second change before min_new samples came in keeps the cost held: the few
        # samples since the last change are the outliers this is for
        if self._count[s] >= self._min_new or np.isnan(self._held[s]):
            m = self._median_new(s)
            if m is not None:
                self._held[s] = m
        self._count[s] = 0

    def __len__(self) -> int:
        return len(self._count)

    def has(self, s: int) -> bool:
        return bool(self._count[s]) or not np.isnan(self._held[s])

    def _median_new(self, s: int) -> Optional[float]:
        c = int(min(self._count[s], self._buf.shape[1]))
        return float(np.median(self._buf[s, :c])) if c else None

    def median(self, s: int) -> Optional[float]:
        """Source ``s``'s cost: the median of its samples since the last clear once
        there are ``min_new`` of them, before that the median held from before the
        clear (or the new samples' median when none was held); None when it has none."""
        if self._count[s] < self._min_new and not np.isnan(self._held[s]):
            return float(self._held[s])
        return self._median_new(s)


@dataclass
class SourceView:
    """What the policy knows of one source at a decision."""
    cost_per_token: Optional[float]  # CPU-seconds per delivered token (None: unmeasured)
    util: float                      # busy fraction of its loaders since the last look
    loaders: int                     # dedicated loaders now (0: packed)
    cpu_rate: Optional[float] = None  # CPU-seconds per second its loaders got (mean)


@dataclass
class ScalePolicy:
    """Sizing of per-source pools (see the module's docstring); :meth:`decide` is pure
    given its inputs and the policy's memory (bias, timers), so it is tested alone."""
    names: Sequence[str]
    weight: Callable[[int, int], float]   # (source, step) -> normalized weight
    tokens_per_step: float
    options: Dict[str, Any]
    bias: List[int] = field(default_factory=list)
    held: List[Dict[str, Any]] = field(default_factory=list)  # feedback not applied, why
    below_since: Dict[int, float] = field(default_factory=dict)
    last_feedback: float = -1e18
    # sources the last decide() kept above their formula's size by down_margin
    held_by_margin: set = field(default_factory=set)

    def __post_init__(self) -> None:
        n = len(self.names)
        self.bias = [0] * n
        self.min = _per_source(self.options["min_loaders"], self.names, "min_loaders")
        self.max = _per_source(self.options["max_loaders"], self.names, "max_loaders")
        for s in range(n):
            if self.min[s] < 0 or self.max[s] < max(1, self.min[s]):
                raise ValueError(f"autoscale: source {self.names[s]}: need 0 <= min_loaders "
                                 f"<= max_loaders, max_loaders >= 1")

    def need(self, s: int, step: int, cost: float, step_time: float,
             ahead: int = 0) -> Tuple[float, int]:
        """(loaders source s needs over the horizon, the step of the largest weight).
        ``ahead``: steps the planner stands ahead of the trainers (raw text is tokenized
        when its step is planned, not when it is consumed), added to the horizon."""
        o = self.options
        best, at = 0.0, step
        for k in range(int(o["horizon_steps"]) + max(0, int(ahead)) + 1):
            w = self.weight(s, step + k)
            if w > best:
                best, at = w, step + k
        rate = o["loader_cpus"] * max(step_time, 1e-9)
        return best * self.tokens_per_step * cost / rate * (1.0 + o["headroom"]), at

    def _fewer_holds(self, s: int, cur: int, need: float) -> bool:
        """Whether a pool of ``cur`` dedicated loaders for source s may lose one: the
        loaders left (less the feedback bias) hold ``need`` x (1 + ``down_margin``), or,
        when none would be left, that is still under ``pack_below`` (back on the
        shared loaders)."""
        o = self.options
        with_margin = need * (1.0 + o["down_margin"])
        fewer = cur - 1 - self.bias[s]
        if fewer >= 1:
            return with_margin <= fewer + 1e-9
        return with_margin < o["pack_below"]

    def decide(self, now: float, step: int, step_time: Optional[float], wait_frac: float,
               sources: Sequence[SourceView], pinned: Mapping[int, int],
               cpu_budget: float, queue_steps: Optional[int] = None, ahead: int = 0,
               cpus_per_loader: Optional[float] = None
               ) -> Tuple[List[int], List[Dict[str, Any]]]:
        """Target dedicated loaders per source and the reasons of each change.

        ``step``: the least step the trainers stand at; ``step_time``: seconds per step
        of compute (the measured step less the data wait; None: not known yet);
        ``wait_frac``: the trainers' data wait as a fraction of the step since the last
        decision; ``pinned``: sources set by hand (``Deployment.scale``);
        ``queue_steps``: steps built ahead of the trainers (None: unknown); a pool
        shrinks only while the queue is not empty; ``ahead``: steps the planner stands
        ahead of ``step`` (see :meth:`need`); ``cpus_per_loader``: CPUs a dedicated
        loader reserves, for the budget (default ``loader_cpus``)."""
        o = self.options
        cur = [v.loaders for v in sources]
        target = list(cur)
        wants = list(cur)  # the formula's size (with bias and bounds), by source
        plain = list(cur)  # the formula's size without the feedback bias (bounded)
        needs = [math.inf] * len(cur)  # the formula's need in loaders (inf: unknown)
        why: Dict[int, str] = {}
        self.held_by_margin = set()
        for s, v in enumerate(sources):
            if s in pinned:
                target[s] = int(pinned[s])
                continue
            if v.cost_per_token is None or step_time is None:
                continue  # nothing measured yet: stay
            need, at = self.need(s, step, v.cost_per_token, step_time, ahead)
            want = 0 if need <= 0 or need < o["pack_below"] else max(1, math.ceil(need - 1e-9))
            plain[s] = min(self.max[s], max(self.min[s], want))
            needs[s] = need
            want = min(self.max[s], max(self.min[s], want + self.bias[s]))
            wants[s] = want
            detail = (f"weight {self.weight(s, step):.3f} now, {self.weight(s, at):.3f} at step "
                      f"{at} (H={int(o['horizon_steps'])}"
                      + (f", planner {int(ahead)} steps ahead" if ahead else "") +
                      f"), cost {v.cost_per_token:.3g} "
                      f"CPU-s/token, step {step_time * 1e3:.1f} ms: need {need:.2f} loaders"
                      + (f" + feedback bias {self.bias[s]}" if self.bias[s] else ""))
            if want > cur[s]:
                target[s] = want
                self.below_since.pop(s, None)
                why[s] = "feed-forward: " + detail
            elif want < cur[s] and cur[s] <= self.max[s] and need > 0 and \
                    not self._fewer_holds(s, cur[s], need):
                # below need, but one loader fewer would not hold it with the margin:
                # steady (hysteresis)
                self.below_since.pop(s, None)
                self.held_by_margin.add(s)
            elif want < cur[s]:
                since = self.below_since.setdefault(s, now)
                if now - since >= o["down_delay_s"] and v.util < o["util_low"] \
                        and wait_frac < o["wait_high"] / 2 and queue_steps != 0:
                    target[s] = cur[s] - 1  # one at a time
                    self.below_since[s] = now
                    why[s] = (f"down after {o['down_delay_s']:g} s below need, util "
                              f"{v.util:.2f}: " + detail)
            else:
                self.below_since.pop(s, None)
        # Feedback: the trainers waited although the feed-forward sizing holds.
        if (wait_frac > o["wait_high"] and not why
                and now - self.last_feedback >= o["cooldown_s"]):
            cand = [s for s, v in enumerate(sources)
                    if s not in pinned and target[s] < self.max[s] and v.util >= o["util_low"]]
            # A busy pool whose loaders get little CPU waits for the CPUs, not for more
            # loaders: the nodes are saturated, and another loader would only compete.
            starved = [s for s in cand if sources[s].cpu_rate is not None
                       and sources[s].cpu_rate < o["cpu_starved"] * o["loader_cpus"]]
            if cand and len(starved) == len(cand):
                s = max(cand, key=lambda i: sources[i].util)
                self.last_feedback = now
                self.held.append({"time": now, "step": step, "source": self.names[s],
                                  "reason": f"feedback held: trainers waited {wait_frac:.1%}; "
                                  f"pool util {sources[s].util:.2f} but its loaders got "
                                  f"{sources[s].cpu_rate:.2f} CPU each (the nodes are "
                                  f"saturated: another loader would only compete)"})
                cand = []
            if cand:
                s = max(cand, key=lambda i: sources[i].util)
                self.bias[s] += 1
                self.last_feedback = now
                target[s] = max(target[s], cur[s] + 1)
                why[s] = (f"feedback: trainers waited {wait_frac:.1%} of the step (> "
                          f"{o['wait_high']:.0%}); pool util {sources[s].util:.2f}, the highest")
        else:
            for s, v in enumerate(sources):  # decay the bias of idle pools
                if self.bias[s] > 0 and v.util < o["util_low"] / 2 \
                        and now - self.last_feedback >= o["down_delay_s"]:
                    self.bias[s] -= 1
        # Global CPU budget: cut first the loaders the formula does not ask for: pools
        # held above their formula's size (by the down-scale delay or margin), then
        # loaders added by feedback (bias); then pools whose need is under one loader
        # (back to the shared loaders, which carry the packed sources); then the largest.
        cpus = o["loader_cpus"] if cpus_per_loader is None else float(cpus_per_loader)
        while sum(target) * cpus > cpu_budget + 1e-9:
            s = max((i for i in range(len(target)) if target[i] > max(self.min[i], 0)
                     and i not in pinned),
                    key=lambda i: (target[i] > wants[i], target[i] > plain[i],
                                   needs[i] < 1.0, target[i]),
                    default=None)
            if s is None:
                break
            target[s] -= 1
            why[s] = (why.get(s, "") + f" (limited by cpu_budget={cpu_budget:g})").strip()
        decisions = [{"time": now, "step": step, "ahead": int(ahead), "source": self.names[s],
                      "from": cur[s], "to": target[s], "reason": why.get(s, "")}
                     for s in range(len(target)) if target[s] != cur[s]]
        return target, decisions


def wait_fraction(dt: float, steps: int, waited_s: float, stood_s: float,
                  step_time: Optional[float]) -> float:
    """The trainers' data wait as a fraction of their time over one look of ``dt``
    seconds in which they finished ``steps`` steps and the mean rank waited
    ``waited_s`` seconds: the wait per step over the step (``steps`` > 0).  A look with
    no finished step is shorter than a step (looks come every ``interval_s``): it is a
    stall (1.0) only when the trainers have stood at their step for ``stood_s`` over
    twice the compute step time ``step_time`` and waited meanwhile, else 0.0 (no
    evidence: before 2026-12-03 any wait in such a look read as 1.0, and feedback added
    loaders while the trainers waited a few milliseconds a step)."""
    if steps > 0:  # the wait per step (waited_s / steps) over the step (dt / steps)
        return min(1.0, max(0.0, waited_s / dt))
    if waited_s > 0 and step_time is not None and stood_s > 2.0 * step_time:
        return 1.0
    return 0.0
