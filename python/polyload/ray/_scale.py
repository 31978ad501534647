"""Source loaders that scale with the work: the autoscaling policy and the actor that
applies it (issue "Source loaders that scale with the work").

Batches never depend on the loaders: a read holds no progress and any loader holding a
partition answers the same bytes, so the autoscaler may split, merge and move index-range
partitions between actors at any step; it only changes the *routing table* (which slot
owns which documents of which source), in this order: start the new actors with their
partitions open, give kept actors the union of old and new partitions, publish the table
to the planner and every constructor (each answers once no read routed by an older table
is in flight), then shrink kept actors to their new partitions and retire the actors the
table no longer names.  A routing table is checked to cover every document of every
source exactly once before it is published.

The policy (:class:`ScalePolicy`, pure Python, no Ray) follows the issue's formula:

* **Feed-forward**: loaders needed for source s over the next ``horizon_steps`` steps =
  max over k in [0, H] of weight_s(t+k) x tokens per step x cost_s / (loader_cpus x
  compute step time) x (1 + headroom), where cost_s is CPU-seconds per delivered token
  measured in the source loaders, and the compute step time is the measured step time
  less the trainers' data wait over the last ``_STEP_WINDOW_S`` (10) seconds.  The
  maximum over the horizon makes pools grow *before* the schedule moves weight to them;
  they shrink only after ``down_delay_s`` below need, and only when one loader fewer
  still holds the need times ``1 + down_margin`` (so a measured cost that wavers around
  a whole number of loaders does not flap the pool).
* **Feedback** (Cachew's and Ray Data's rules): when trainers waited more than
  ``wait_high`` of the step, add one loader to the most utilized pool, one change per
  ``cooldown_s``, unless its loaders get under ``cpu_starved`` x ``loader_cpus`` CPU
  (the nodes are saturated: another loader would only compete; held and logged); a bias that decays when the pool is idle below ``util_low`` for
  ``down_delay_s``.  A pool shrinks only while the constructors' queue holds built
  steps (data is ahead of the trainers).  Costs are sampled only at a steady count
  (``steady_s`` after the source's last change) and the median of the last samples is
  used (outliers discarded); after a change the cost measured before it stays in use
  until ``min_samples`` samples of the new count are in.
* **Bounds**: per-source ``min_loaders`` / ``max_loaders`` and a global ``cpu_budget``.
  A source whose need is under ``pack_below`` loaders stays packed on the shared actors
  the deployment started with (hundreds of small sources on a few actors).
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import time
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


_LOOK_TIMEOUT_S = 10.0  # seconds a measurement waits for each role's answer
#: half-life, in seconds, of the running sums that give a raw text source's tokenizing
#: CPU per delivered token (tokenizing comes in batches ahead of the reads)
_TOKENIZE_HALFLIFE_S = 10.0
#: seconds of looks over which the trainers' compute step time is measured
_STEP_WINDOW_S = 10.0


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


def split_ranges(n_docs: int, parts: int) -> List[Tuple[int, int]]:
    """``parts`` index ranges covering ``[0, n_docs)``, equal to within one document."""
    parts = max(1, min(int(parts), max(1, int(n_docs))))
    edges = np.linspace(0, n_docs, parts + 1).round().astype(np.int64)
    return [(int(edges[p]), int(edges[p + 1])) for p in range(parts)]


def check_table(table: Mapping[str, Any], num_documents: Sequence[int]) -> None:
    """Refuse a routing table that leaves a document of a source unowned or owned
    twice, or names a slot that does not exist or is retired (ValueError naming the
    source)."""
    names = list(table["sources"])
    n_slots = len(table["slots"])
    gone = set(int(j) for j in table.get("retired") or [])
    per: Dict[str, List[Tuple[int, int]]] = {n: [] for n in names}
    for name, lo, hi, slot in table["partitions"]:
        if name not in per or not 0 <= int(slot) < n_slots or not lo < hi:
            raise ValueError(f"routing: bad partition {[name, lo, hi, slot]}")
        if int(slot) in gone:
            raise ValueError(f"routing: partition {[name, lo, hi, slot]} on retired slot {slot}")
        per[name].append((int(lo), int(hi)))
    for s, name in enumerate(names):
        at = 0
        for lo, hi in sorted(per[name]):
            if lo != at:
                raise ValueError(f"routing: source {name}: documents {min(lo, at)}..{max(lo, at)} "
                                 f"are owned {'twice' if lo < at else 'by nobody'}")
            at = hi
        if at != int(num_documents[s]) and num_documents[s] > 0:
            raise ValueError(f"routing: source {name}: documents {at}..{num_documents[s]} "
                             f"are owned by nobody")


# =============================================================== the actor


class Autoscaler:
    """The deployment's scaling role (actor ``NAME.autoscaler``): owns the routing table
    after launch, applies :class:`ScalePolicy` every ``interval_s`` (when enabled) and
    manual :meth:`scale` calls, and keeps every decision with its reason.  An async
    actor; one change is applied at a time."""

    def __init__(self, payload, cwd: str, name: str, namespace: str, table: Dict[str, Any],
                 num_documents: Sequence[int], options: Dict[str, Any],
                 loader_options: Dict[str, Any], shadows: int, detached: bool,
                 constructors: Sequence[str]) -> None:
        self._payload, self._cwd = payload, cwd
        self._name, self._namespace = name, namespace
        self._table = table
        self._ndocs = [int(n) for n in num_documents]
        self._opts = options
        self._loader_opts = dict(loader_options)
        # whether new loaders need FAILURE_DETECTION_ENV through a runtime_env
        self._failure_env = bool(self._loader_opts.pop("_failure_env", True))
        self._shadows = int(shadows if options.get("shadows") is None else options["shadows"])
        self._detached = bool(detached)
        # per DP group: its constructor, then its standbys
        self._ctor_groups = [[c] if isinstance(c, str) else list(c) for c in constructors]
        self._lock = asyncio.Lock()
        self.decisions: collections.deque = collections.deque(maxlen=1000)
        # final cost profiles of the loaders retired so far (view()["retired_loaders"])
        self.retired_loaders: collections.deque = collections.deque(maxlen=1000)
        self._pinned: Dict[int, int] = {}
        self._task: Optional[asyncio.Task] = None
        self._ready = False

    async def setup(self) -> Dict[str, Any]:
        import ray  # noqa: PLC0415

        from ._common import enter_cwd, make_config  # noqa: PLC0415

        enter_cwd(self._cwd)
        cfg = make_config(self._payload)
        self._cfg = cfg
        names = list(self._table["sources"])
        self._names = names
        tokens = cfg.get_int("global_batch_size") * cfg.get_int("seq_length")
        self._policy = ScalePolicy(names, lambda s, t: cfg.source_weight(s, max(0, t)),
                                   float(tokens), self._opts)
        self._planner = ray.get_actor(f"{self._name}.planner", namespace=self._namespace)
        saved = await self._planner.routing.remote()
        restarted = False
        if saved is not None and saved.get("version", 0) >= self._table.get("version", 0):
            self._table = saved  # restarted: the table last published
            self._pinned = {int(k): int(v) for k, v in (saved.get("pinned") or {}).items()}
            restarted = saved.get("version", 0) > 0
        self._handles: Dict[str, Any] = {}
        self._ctors = [ray.get_actor(n, namespace=self._namespace)
                       for grp in self._ctor_groups for n in grp]
        # which slots are dedicated to which source (slots never renumber)
        self._dedicated: Dict[int, List[int]] = {}
        gone = set(int(j) for j in self._table.get("retired") or [])
        for j, d in enumerate(self._table.get("dedicated", [None] * len(self._table["slots"]))):
            if d is not None and j not in gone:
                self._dedicated.setdefault(int(d), []).append(j)
        self._last: Dict[str, Any] = {}
        self._samples = _Samples(len(names), int(self._opts["samples"]),
                                 int(self._opts["min_samples"]))
        self._changed = [time.monotonic()] * len(names)
        self._step_time: Optional[float] = None
        self._step_since = time.monotonic()  # when the trainers' step last moved
        self._step_win: collections.deque = collections.deque()  # (dt, steps, wait)
        # per source, decaying sums of tokenizing CPU-seconds and of delivered tokens
        self._tkz_ew = np.zeros((len(names), 2), dtype=np.float64)
        self._calibrated: set = set()
        self._reserved: Dict[Any, float] = {}  # CPUs of loaders being placed, by node
        self._avail: Optional[Dict[Any, Dict[str, float]]] = None  # snapshot of a change
        self._free_cpus = float(ray.available_resources().get("CPU", 1.0))
        self._calib: Dict[int, float] = {}  # cost by calibration (until traffic)
        self._view: Dict[str, Any] = {}
        self._cpu_used = 0.0  # CPU-seconds reserved by dedicated loaders
        self._t_prev = time.monotonic()
        self._ready = True
        # measured always (polyload top, Deployment.scaling); decided only when enabled
        self._task = asyncio.ensure_future(self._loop(restarted))
        return {"pid": os.getpid()}

    # ----------------------------------------------------------- helpers

    def _handle(self, name: str):
        import ray  # noqa: PLC0415

        h = self._handles.get(name)
        if h is None:
            h = self._handles[name] = ray.get_actor(name, namespace=self._namespace)
        return h

    def _slot_shards(self, table) -> List[List[Tuple[int, int, int]]]:
        index = {n: s for s, n in enumerate(table["sources"])}
        out: List[List[Tuple[int, int, int]]] = [[] for _ in table["slots"]]
        for name, lo, hi, slot in table["partitions"]:
            out[int(slot)].append((index[name], int(lo), int(hi)))
        return out

    def _dedicated_count(self, s: int) -> int:
        return len(self._dedicated.get(s, []))

    def _loaders_of(self, s: int, table=None) -> List[int]:
        table = table or self._table
        name = self._names[s]
        return sorted({int(slot) for n, _lo, _hi, slot in table["partitions"] if n == name})

    def _pick_placement(self, cpus: Optional[float] = None,
                        avoid: Optional[str] = None) -> Dict[str, Any]:
        """Ray options of a new loader: the first ``placement`` entry some node can host
        now (its resources and the loader's CPUs free there; the loader is then pinned
        to that node), else the last entry as it is.  Default: launch's source-loader
        options.  So ``[{"resources": {"trainer": 0.01}}, {"resources": {"cpu_only":
        0.01}}]`` fills the spare CPUs of trainer nodes (sidecars) first, then CPU-only
        nodes."""
        import ray  # noqa: PLC0415

        prefs = self._opts.get("placement") or [self._loader_opts]
        # One snapshot per change, less the loaders placed since (Ray's own figures
        # would count those twice once it has scheduled them).
        per_node = self._avail
        if per_node is None:
            try:
                from ray._private.state import available_resources_per_node  # noqa: PLC0415

                per_node = available_resources_per_node()
            except Exception:  # noqa: BLE001 - a Ray without it: the cluster's totals
                per_node = {None: ray.available_resources()}
            self._avail = per_node
        for p in prefs:
            p = dict(p or {})
            if "node_id" in p or "label_selector" in p or "scheduling_strategy" in p:
                return p  # placed by the caller's rule
            need = dict(p.get("resources") or {})
            need["CPU"] = float(p.get("num_cpus", self._opts["loader_cpus"])) \
                if cpus is None else float(cpus)
            nodes = sorted(per_node, key=lambda n: n == avoid)  # another node first
            for node in nodes:
                free = dict(per_node[node])
                free["CPU"] = free.get("CPU", 0.0) - self._reserved.get(node, 0.0)
                if all(free.get(k, 0.0) >= v - 1e-9 for k, v in need.items()):
                    if node is not None:
                        p["node_id"] = node
                        self._reserved[node] = self._reserved.get(node, 0.0) + need["CPU"]
                    return p
        return dict(prefs[-1] or {})

    async def _start_loader(self, slot: int, shards) -> List[str]:
        """A new slot's actor and standbys, sources open; their names."""
        import ray  # noqa: PLC0415

        from ._actors import SourceLoader  # noqa: PLC0415

        actor_cls = ray.remote(SourceLoader)
        base = f"{self._name}.source_loader.{slot}"
        names = [base] + [f"{base}.shadow.{k}" for k in range(self._shadows)]
        # a name left by an interrupted change (killed, not yet released): wait for it
        for n in names:
            for _ in range(100):
                try:
                    h = ray.get_actor(n, namespace=self._namespace)
                except ValueError:
                    break
                ray.kill(h, no_restart=True)
                await asyncio.sleep(0.1)
        made = []
        primary_node = None
        for k, n in enumerate(names):
            # detached: an actor's actors die with it, and these must outlive a restart
            # of the autoscaler; each leaves once the deployment's planner is gone
            o = {"name": n, "namespace": self._namespace, "max_concurrency": 2,
                 "max_restarts": -1, "lifetime": "detached"}
            # standbys read only when their primary is gone: no CPU, another node
            p = self._pick_placement(0.0 if k else None, avoid=primary_node if k else None)
            node_id = p.pop("node_id", None)
            if k == 0:
                primary_node = node_id
            o.update(p)
            o.setdefault("num_cpus", float(self._opts["loader_cpus"]))
            if k > 0:
                o["num_cpus"] = 0
            if node_id is not None:
                from ray.util.scheduling_strategies import (  # noqa: PLC0415
                    NodeAffinitySchedulingStrategy)
                o["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id,
                                                                           soft=k > 0)
            from ._common import with_failure_detection  # noqa: PLC0415

            a = actor_cls.options(**with_failure_detection(o, self._failure_env)).remote(
                self._payload, self._cwd, shards, f"{self._name}.planner")
            self._handles[n] = a
            made.append(a)
        # the standbys hold no tokenizer nor index pages until they take over
        await asyncio.gather(*[a.setup.remote(True, standby=k > 0)
                               for k, a in enumerate(made)])
        return names

    async def _publish_planner(self, table) -> None:
        check_table(table, self._ndocs)
        await self._planner.set_routing.remote(
            table["sources"], table["partitions"], table["source_loaders"],
            self._namespace, table["version"], table["slots"],
            {"dedicated": table.get("dedicated"), "retired": table.get("retired", []),
             "pinned": dict(self._pinned)})

    async def _publish_constructors(self, table) -> None:
        """Every constructor routes by ``table`` and no read of an older one is in
        flight; the planner's lengths calls of older tables are done.  A constructor
        that died meanwhile reads the table at its restart (from the planner)."""
        from ._common import actor_lost, unwrap  # noqa: PLC0415

        deadline = time.monotonic() + float(self._opts["start_timeout_s"])
        res = await asyncio.gather(*[asyncio.wait_for(c.set_routing.remote(table),
                                                      self._opts["start_timeout_s"])
                                     for c in self._ctors], return_exceptions=True)
        for r in res:
            if isinstance(r, asyncio.TimeoutError):
                raise RuntimeError(
                    f"autoscaler: a constructor still had reads of a table older than "
                    f"v{table['version']} in flight after start_timeout_s="
                    f"{self._opts['start_timeout_s']:g} s; kept loaders keep both tables' "
                    f"partitions, and retired loaders stay up, unused")
            if isinstance(r, BaseException):
                if not actor_lost(unwrap(r)):
                    raise unwrap(r)  # kept loaders keep both tables' partitions
                self._error(f"publishing routing v{table['version']} to a constructor "
                            f"that is restarting (it reads the table then): "
                            f"{type(r).__name__}")
        while not await self._planner.drained.remote(table["version"]):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"autoscaler: the planner still had lengths calls of a table older "
                    f"than v{table['version']} after start_timeout_s="
                    f"{self._opts['start_timeout_s']:g} s; kept loaders keep both tables' "
                    f"partitions, and retired loaders stay up, unused")
            await asyncio.sleep(0.05)

    def _error(self, msg: str) -> None:
        self.decisions.append({"time": time.time(), "step": self._view.get("step"),
                               "source": None, "from": None, "to": None,
                               "reason": f"error: {msg}"})

    # ----------------------------------------------------------- changes

    def _names_of(self, j: int) -> List[str]:
        base = f"{self._name}.source_loader.{j}"
        return [base] + [f"{base}.shadow.{k}" for k in range(self._shadows)]

    async def _keep_final_profiles(self, names: Sequence[str]) -> None:
        """Before retiring loaders: keep what each one used (its last cost profile,
        asked of all at once with a 2 s limit; a loader that does not answer is
        recorded with ``"error"`` and no ``cpu_s``), so the CPU a pool used still
        counts its retired loaders (``view()["retired_loaders"]``: the last 1,000
        retired since this autoscaler started)."""
        async def one(n):
            rec: Dict[str, Any] = {"actor": n, "time": time.time(),
                                   "step": self._view.get("step")}
            try:
                p = await asyncio.wait_for(self._handle(n).profile.remote(), timeout=2.0)
                rec.update({k: p.get(k) for k in ("cpu_s", "read_cpu_s", "wall_s", "busy_s")})
                rec["sources"] = {self._names[int(s)]: v
                                  for s, v in (p.get("sources") or {}).items()}
            except Exception as e:  # noqa: BLE001 - lost or busy: recorded as unknown
                rec["error"] = f"{type(e).__name__}: {e}"[:200]
            return rec

        self.retired_loaders.extend(await asyncio.gather(*[one(n) for n in names]))

    async def _kill(self, names: Sequence[str], forget: bool = True) -> None:
        """Kill these loaders for good (and drop their partitions from Ray's KV)."""
        import ray  # noqa: PLC0415

        from ._actors import _kv_del  # noqa: PLC0415

        for n in names:
            h = self._handles.pop(n, None)
            if h is None:
                try:
                    h = ray.get_actor(n, namespace=self._namespace)
                except ValueError:
                    h = None
            if h is not None:
                try:
                    ray.kill(h, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            if forget:
                _kv_del(f"polyload:{self._namespace}:{n}.shards".encode())

    async def _set_shards(self, names: Sequence[str], shards) -> None:
        """``set_shards`` on each actor, asked again after a restart of the actor
        (idempotent); an actor gone for good is skipped (its slot's standby serves)."""
        from ._common import actor_lost, unwrap  # noqa: PLC0415

        async def one(n):
            for attempt in range(20):
                try:
                    return await self._handle(n).set_shards.remote(shards)
                except Exception as e:  # noqa: BLE001
                    if not actor_lost(unwrap(e)) or attempt == 19:
                        raise
                    await asyncio.sleep(0.5)
        await asyncio.gather(*[one(n) for n in names])

    async def _resize(self, counts: Mapping[int, int]) -> None:
        """Give each source in ``counts`` that many dedicated loaders (0: back on the
        shared actors), in the order of the module's docstring.  Until the planner
        holds the new table nothing has changed (new actors are killed on a failure);
        after that the new table is the deployment's, and what is left (constructors
        that died meanwhile read it at their restart, shrinking kept loaders, retiring
        the others) is finished here or by a restarted autoscaler (:meth:`_reconcile`)."""
        old = self._table
        slots = [list(x) for x in old["slots"]]
        dedicated = list(old.get("dedicated", [None] * len(slots)))
        was_retired = set(int(j) for j in old.get("retired") or [])
        parts = [list(p) for p in old["partitions"]]
        old_shards = self._slot_shards(old)
        new_slots: Dict[int, List[Tuple[int, int, int]]] = {}
        retired: List[int] = []
        dedicated_of = {k: list(v) for k, v in self._dedicated.items()}  # committed last
        for s, n in counts.items():
            name = self._names[s]
            mine = list(dedicated_of.get(s, []))
            keep = mine[:n]
            retired += mine[n:]
            parts = [p for p in parts if p[0] != name]
            if n == 0:  # back to the shared actors: the one with the fewest partitions
                shared = [j for j in range(len(slots)) if dedicated[j] is None
                          and j not in retired and j not in was_retired]
                load = {j: sum(1 for p in parts if p[3] == j) for j in shared}
                j = min(shared, key=lambda j: (load[j], j))
                parts.append([name, 0, self._ndocs[s], j])
                dedicated_of.pop(s, None)
                continue
            ranges = split_ranges(self._ndocs[s], n)
            owners = list(keep)
            while len(owners) < len(ranges):
                j = len(slots)  # slot indices only grow: never reused
                slots.append(self._names_of(j))
                dedicated.append(s)
                new_slots[j] = []
                owners.append(j)
            for (lo, hi), j in zip(ranges, owners):
                parts.append([name, lo, hi, j])
                if j in new_slots:
                    new_slots[j].append((s, lo, hi))
            dedicated_of[s] = owners[:len(ranges)]
        for j in retired:
            dedicated[j] = None
        table = {"sources": list(old["sources"]), "partitions": parts,
                 "slots": slots, "source_loaders": [x[0] for x in slots],
                 "namespace": self._namespace, "version": int(old.get("version", 0)) + 1,
                 "dedicated": dedicated,
                 "retired": sorted(was_retired | set(retired))}
        check_table(table, self._ndocs)
        new_shards = self._slot_shards(table)
        created = [n for j in new_slots for n in slots[j]]
        try:
            # 1. new actors, their partitions open
            try:
                started = await asyncio.wait_for(
                    asyncio.gather(*[self._start_loader(j, sh) for j, sh in new_slots.items()]),
                    float(self._opts["start_timeout_s"]))
            except asyncio.TimeoutError:
                raise RuntimeError(
                    f"autoscaler: new source loaders for {sorted(self._names[s] for s in counts)} "
                    f"were not running within start_timeout_s="
                    f"{self._opts['start_timeout_s']:g} s (no node with the CPUs and resources "
                    f"of placement {self._opts.get('placement') or self._loader_opts}?); "
                    f"the pools stay as they were") from None
            finally:
                self._reserved, self._avail = {}, None  # Ray's accounting has them now
            for (j, _), names in zip(new_slots.items(), started):
                slots[j] = names
            table["source_loaders"] = [x[0] for x in slots]
            # 2. kept actors hold old and new partitions while both tables are in use
            both = []
            for j in range(len(old_shards)):
                if j in retired or j in was_retired:
                    continue
                union = sorted(set(old_shards[j]) | set(new_shards[j]))
                if union != sorted(old_shards[j]):
                    both.append(self._set_shards(slots[j], union))
            await asyncio.gather(*both)
            # 3. the planner first: from here on the new table is the deployment's
            await self._publish_planner(table)
        except BaseException:
            await self._kill(created)
            raise
        self._table = table
        self._dedicated = dedicated_of
        now = time.monotonic()
        for s in counts:
            self._changed[s] = now
            self._samples.clear(s)
        await self._publish_constructors(table)
        # 4. shrink and retire
        await self._finish(old_shards, new_shards, retired, slots)

    async def _finish(self, old_shards, new_shards, retired, slots) -> None:
        shrink = []
        for j in range(len(old_shards)):
            if j in retired or j >= len(new_shards) or \
                    sorted(new_shards[j]) == sorted(old_shards[j]) or j in set(
                        self._table.get("retired") or []):
                continue
            shrink.append(self._set_shards(slots[j], new_shards[j]))
        results = await asyncio.gather(*shrink, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                self._error(f"shrinking a kept loader's partitions: {type(r).__name__}: {r}")
        await self._keep_final_profiles([n for j in retired for n in slots[j]])
        for j in retired:
            await self._kill(slots[j])

    async def _reconcile(self) -> None:
        """After a restart of the autoscaler: finish what a change it was making left
        (actors of retired slots or of slots the table never got are killed, live
        loaders hold exactly their partitions of the table)."""
        import ray  # noqa: PLC0415
        from ray.util import list_named_actors  # noqa: PLC0415

        table = self._table
        gone = set(int(j) for j in table.get("retired") or [])
        prefix = f"{self._name}.source_loader."
        stray = []
        for a in list_named_actors(all_namespaces=True):
            n = a.get("name", "")
            if a.get("namespace") != self._namespace or not n.startswith(prefix):
                continue
            try:
                j = int(n[len(prefix):].split(".")[0])
            except ValueError:
                continue
            if j >= len(table["slots"]) or j in gone:
                stray.append(n)
        await self._kill(stray)
        await self._publish_constructors(table)
        shards = self._slot_shards(table)
        await asyncio.gather(*[self._set_shards(table["slots"][j], shards[j])
                               for j in range(len(table["slots"])) if j not in gone],
                             return_exceptions=True)
        del ray

    async def scale(self, source: str, n: Optional[int]) -> Dict[str, Any]:
        """Give ``source`` ``n`` dedicated loaders (0: back on the shared actors) and
        hold it there (the policy leaves it alone) until ``scale(source, None)``."""
        await self._ensure()
        if source not in self._names:
            raise ValueError(f"scale: unknown source {source!r} (sources: {self._names})")
        s = self._names.index(source)
        if n is None:
            self._pinned.pop(s, None)
            self._log(s, self._dedicated_count(s), self._dedicated_count(s),
                      "manual: released to the policy")
            return self.view_now()
        n = int(n)
        if n < 0:
            raise ValueError(f"scale: n must be >= 0, got {n}")
        async with self._lock:
            before = self._dedicated_count(s)
            old_pin = self._pinned.get(s)
            self._pinned[s] = n  # published with the table
            try:
                if n != before:
                    await self._resize({s: n})
            except BaseException:
                if old_pin is None:
                    self._pinned.pop(s, None)
                else:
                    self._pinned[s] = old_pin
                raise
            self._log(s, before, n, "manual: Deployment.scale")
        return self.view_now()

    def _log(self, s: int, a: int, b: int, reason: str, step: Optional[int] = None,
             ahead: int = 0) -> None:
        rec = {"time": time.time(), "step": step if step is not None else self._view.get("step"),
               "ahead": ahead, "source": self._names[s], "from": a, "to": b, "reason": reason,
               "version": self._table.get("version", 0)}
        self.decisions.append(rec)

    async def _ensure(self) -> None:
        if not self._ready:
            await self.setup()

    # ----------------------------------------------------------- the loop

    async def _measure(self) -> Dict[str, Any]:
        """One look at the loaders, constructors and planner: costs, utilization, wait."""
        slots = self._table["slots"]
        live = sorted({int(p[3]) for p in self._table["partitions"]})
        look = _LOOK_TIMEOUT_S  # a role that does not answer is left out of this look
        profs = await asyncio.gather(*[asyncio.wait_for(
            self._handle(slots[j][0]).profile.remote(), look) for j in live],
            return_exceptions=True)
        flat = await asyncio.gather(*[asyncio.wait_for(c.load.remote(), look)
                                      for c in self._ctors], return_exceptions=True)
        loads: List[Any] = []  # per group: the constructor serving it (most fetches)
        for grp in self._ctor_groups:
            xs, flat = flat[:len(grp)], flat[len(grp):]
            ok = [x for x in xs if not isinstance(x, BaseException) and x.get("serving", True)]
            loads.append(max(ok, key=lambda x: x["fetches"]) if ok else
                         RuntimeError("no constructor of the group answered"))
        prog = await asyncio.wait_for(self._planner.progress.remote(), look)
        now = time.monotonic()
        last = self._last
        dt = max(1e-6, now - last.get("time", now - 1e-6))
        n = len(self._names)
        per_src_busy = [0.0] * n
        read_cpu, read_tok = [0.0] * n, [0.0] * n
        tok_cpu = [0.0] * n
        slot_util: Dict[int, float] = {}
        slot_cpu: Dict[int, float] = {}
        prev_profs = last.get("profs", {})
        for j, p in zip(live, profs):
            if isinstance(p, BaseException):
                continue
            q = prev_profs.get(j)
            # kept until the next look, compact: the sources' counters as one array
            # (busy_s, tokens, read_cpu_s, tokenize_cpu_s) by source index
            served = sorted(int(s) for s in p["sources"])
            src = np.array([[p["sources"][s][k] for k in (
                "busy_s", "tokens", "read_cpu_s", "tokenize_cpu_s")]
                for s in served], dtype=np.float64).reshape(-1, 4)
            p = {k: p[k] for k in ("pid", "busy_s", "wall_s", "cpu_s", "read_cpu_s",
                                   "read_split") if k in p}
            p["index"], p["sources"] = np.asarray(served, dtype=np.int64), src
            prev_profs[j] = p
            if q is None or q.get("pid") != p.get("pid"):  # new or restarted: no delta
                continue
            # busy fraction (two calls may overlap: capped at 1), CPU it got per second
            slot_util[j] = min(1.0, (p["busy_s"] - q["busy_s"]) /
                               max(1e-6, p["wall_s"] - q["wall_s"]))
            slot_cpu[j] = (p["cpu_s"] - q["cpu_s"]) / max(1e-6, p["wall_s"] - q["wall_s"])
            # A loader's reads and its tokenizing serve all its sources at once.  Reads:
            # the actor splits each call's CPU by the time C measured per source
            # ("read_split": "time"), taken as it is; a profile without it is split
            # here by tokens x each source's calibrated cost (measured alone), so an
            # image source packed with a token source is not charged to the tokens.
            # Tokenizing CPU is measured per source in C (profile "tokenize_cpu_s").
            timed = p.get("read_split") == "time"
            d_read, d_rcpu = {}, 0.0
            qi = q["index"]  # the previous look's counters of the same sources (0: none)
            before = np.zeros((len(served), 4), dtype=np.float64)
            if len(qi) and len(served):
                at = np.minimum(np.searchsorted(qi, p["index"]), len(qi) - 1)
                was = qi[at] == p["index"]
                before[was] = q["sources"][at[was]]
            for k, s in enumerate(served):
                v, u = p["sources"][k], before[k]
                per_src_busy[s] += float(v[0] - u[0])
                d_read[s] = int(v[1] - u[1])
                d_rcpu += float(v[2] - u[2])
                tok_cpu[s] += max(0.0, float(v[3] - u[3]))
                read_tok[s] += d_read[s]
                if timed:
                    read_cpu[s] += float(v[2] - u[2])
            w_read = {s: d_read[s] * self._prior(s) for s in d_read}
            sr = sum(w_read.values())
            if sr > 0 and not timed:
                for s in d_read:
                    read_cpu[s] += d_rcpu * w_read[s] / sr
        # Tokenizing per delivered token: a document is tokenized whole (ahead, for its
        # length) though long_documents: truncate delivers only its first seq_length
        # tokens, so the CPU per tokenized token would understate the cost of a token
        # delivered (by 1.7x on the bench's docs).  Tokenizing comes in batches ahead of
        # the reads: both sides are summed with a decay (half-life _TOKENIZE_HALFLIFE_S)
        # and their ratio is the source's tokenizing cost per delivered token.
        decay = 0.5 ** (dt / _TOKENIZE_HALFLIFE_S)
        self._tkz_ew *= decay
        self._tkz_ew[:, 0] += tok_cpu
        self._tkz_ew[:, 1] += read_tok
        for s in range(n):
            if read_tok[s] > 0 and now - self._changed[s] >= self._opts["steady_s"]:
                # CPU-seconds per delivered token: reading it, plus tokenizing it (0 for
                # a pre-tokenized source)
                c = read_cpu[s] / read_tok[s] + self._tkz_ew[s, 0] / self._tkz_ew[s, 1]
                self._samples.append(s, c)
        # the constructors' fetch waits, as differences per constructor process (a
        # restarted constructor starts its counter again)
        prev_waits = last.get("waits", {})
        waits: Dict[int, Tuple[int, float]] = {}
        d_wait = 0.0
        for g, x in enumerate(loads):
            if isinstance(x, BaseException):
                continue
            # the trainers' own wait when they report it (Client.data_wait_s), else the
            # fetches' wait at the constructor (an upper bound)
            w = x["trainer_wait_s"] if x.get("trainer_ranks") else x["wait_s"]
            waits[g] = (x.get("pid"), w, bool(x.get("trainer_ranks")))
            q = prev_waits.get(g)
            if q is not None and q[0] == x.get("pid") and q[2] == waits[g][2]:
                d_wait += max(0.0, w - q[1])
        wait = last.get("wait", 0.0) + d_wait  # cumulative over processes
        fetches = sum(x["fetches"] for x in loads if not isinstance(x, BaseException))
        queue = min([x["queue_steps"] for x in loads if not isinstance(x, BaseException)],
                    default=0)
        # the trainers' step: the least one their fetches reported (finer than the
        # planner's, which hears of it once per plan request)
        lows = [x["consumed"] for x in loads if not isinstance(x, BaseException)
                and x.get("consumed", -1) >= 0]
        step = min(lows) if len(lows) == len(self._ctor_groups) and lows else \
            (prog["low"] if prog["low"] >= 0 else prog["start_step"])
        wait_frac = 0.0
        if "step" in last:
            steps = max(0, step - last["step"])
            # ranks wait concurrently: the mean rank's wait
            n_ranks = max(1, len(self._cfg_ranks()))
            wait_frac = wait_fraction(dt, steps, (wait - last["wait"]) / n_ranks,
                                      now - self._step_since, self._step_time)
            # compute step time: the looks of the last _STEP_WINDOW_S seconds, their
            # time less the mean rank's wait, over the steps finished (a look sees 0, 1
            # or 2 steps of the trainers' reports: one look's figure was off by up to 2x)
            win = self._step_win
            win.append((dt, steps, max(0.0, (wait - last["wait"]) / n_ranks)))
            while len(win) > 1 and sum(x[0] for x in win) - win[0][0] >= _STEP_WINDOW_S:
                win.popleft()
            n_steps = sum(x[1] for x in win)
            if n_steps > 0:
                self._step_time = max(1e-6, (sum(x[0] for x in win) -
                                             sum(x[2] for x in win)) / n_steps)
        if "step" not in last or step != last["step"]:
            self._step_since = now
        # Sources with no traffic yet (weight 0 now): calibrate once on their owner
        # (a first estimate, replaced by the samples of traffic once there are any).
        # Only with the policy enabled: without it nothing decides from the estimate,
        # and each calibration costs an actor call, a read of 32 documents and a result
        # kept, per source (memory that grew with the sources; the view's cost of a
        # source stays None until traffic).
        todo = [s for s in range(n) if not self._samples.has(s) and s not in self._calibrated
                and self._loaders_of(s)] if self._opts.get("enabled", True) else []
        for k in range(0, len(todo), 16):
            batch = todo[k:k + 16]
            self._calibrated.update(batch)
            res = await asyncio.gather(*[asyncio.wait_for(
                self._handle(slots[self._loaders_of(s)[0]][0]).calibrate.remote(s, 32), 60.0)
                for s in batch], return_exceptions=True)
            for s, c in zip(batch, res):
                if not isinstance(c, BaseException) and c["tokens"] > 0:
                    self._calib[s] = c["cpu_s"] / c["tokens"]
        self._last = {"time": now, "step": step, "wait": wait, "profs": prev_profs,
                      "waits": waits}
        util = []
        for s in range(len(self._names)):
            mine = self._loaders_of(s)
            us = [slot_util[j] for j in mine if j in slot_util]
            if self._dedicated_count(s) == 0 and us:
                # packed: its share of the shared actors' busy time
                util.append(min(1.0, per_src_busy[s] / dt / max(1, len(mine))))
            else:
                util.append(float(np.mean(us)) if us else 0.0)
        cpu_rate: List[Optional[float]] = []
        for s in range(len(self._names)):
            cs = [slot_cpu[j] for j in self._loaders_of(s) if j in slot_cpu]
            cpu_rate.append(float(np.mean(cs)) if cs else None)
        return {"step": step, "wait_frac": wait_frac, "queue_steps": queue, "util": util,
                "cpu_rate": cpu_rate,
                "fetches": fetches, "dt": dt, "next_step": prog["next_step"],
                "ahead": max(0, int(prog["next_step"]) - int(step))}

    def _cfg_ranks(self) -> List[int]:
        return list(range(self._cfg.world_size()))

    def _prior(self, s: int) -> float:
        """A source's cost measured alone (calibration), to split a shared loader's CPU;
        the median of the others' when it has none."""
        c = self._calib.get(s)
        if c is not None and c > 0:
            return c
        known = [v for v in self._calib.values() if v > 0]
        return float(np.median(known)) if known else 1.0

    def _cost(self, s: int) -> Optional[float]:
        c = self._samples.median(s)
        return c if c is not None else self._calib.get(s)

    def _budget(self) -> float:
        """``cpu_budget``, default the CPUs free in the cluster when the deployment
        started (what its other roles and other jobs left)."""
        b = self._opts.get("cpu_budget")
        return float(b) if b is not None else self._free_cpus

    def _cpus_per_loader(self) -> float:
        """CPUs a dedicated loader reserves: its placement's ``num_cpus``, else
        ``loader_cpus``."""
        prefs = self._opts.get("placement") or [self._loader_opts]
        p = prefs[0] or {}
        return float(p.get("num_cpus", self._opts["loader_cpus"]))

    async def _tick(self) -> None:
        async with self._lock:  # a manual scale() never interleaves with a decision
            await self._tick_locked()

    async def _tick_locked(self) -> None:
        m = await self._measure()
        now = time.monotonic()
        self._cpu_used += sum(self._dedicated_count(s) for s in range(len(self._names))) \
            * self._cpus_per_loader() * m["dt"]
        views = [SourceView(self._cost(s), m["util"][s], self._dedicated_count(s),
                            m["cpu_rate"][s]) for s in range(len(self._names))]
        if self._opts.get("enabled", True):
            target, decisions = self._policy.decide(
                now, m["step"], self._step_time, m["wait_frac"], views, self._pinned,
                self._budget(), m["queue_steps"], m["ahead"], self._cpus_per_loader())
        else:  # manual control only: measure, never change
            target, decisions = [v.loaders for v in views], []
        need = [None if v.cost_per_token is None or self._step_time is None else
                self._policy.need(s, m["step"], v.cost_per_token, self._step_time,
                                  m["ahead"])[0]
                for s, v in enumerate(views)]
        self._view = {**m, "step_time": self._step_time, "target": target, "need": need,
                      "cost": [v.cost_per_token for v in views],
                      "held_by_margin": sorted(self._policy.held_by_margin)}
        for h in self._policy.held:  # feedback the policy held back: logged with why
            self.decisions.append({**h, "time": time.time(), "ahead": m["ahead"],
                                   "from": None, "to": None,
                                   "version": self._table.get("version", 0)})
        self._policy.held.clear()
        changes = {self._names.index(d["source"]): d["to"] for d in decisions}
        if changes:
            await self._resize(changes)
            for d in decisions:
                s = self._names.index(d["source"])
                self._log(s, d["from"], d["to"], d["reason"], m["step"], d["ahead"])

    async def _loop(self, restarted: bool = False) -> None:
        if restarted:
            async with self._lock:
                try:
                    await self._reconcile()
                except Exception as e:  # noqa: BLE001
                    self._error(f"after a restart: {type(e).__name__}: {e}")
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - keep scaling; say why in the log
                self._error(f"{type(e).__name__}: {e}")
            await asyncio.sleep(float(self._opts["interval_s"]))

    # ----------------------------------------------------------- visibility

    def view_now(self) -> Dict[str, Any]:
        v = self._view
        gone = set(self._table.get("retired", []))
        ded = self._table.get("dedicated") or [None] * len(self._table["slots"])
        srcs = []
        for s, name in enumerate(self._names):
            mine = self._loaders_of(s)
            srcs.append({
                "source": name,
                "weight": self._cfg.source_weight(s, max(0, int(v.get("step") or 0))),
                "loaders": len(mine),
                "dedicated": self._dedicated_count(s),
                "partitions": sum(1 for p in self._table["partitions"] if p[0] == name),
                "util": (v.get("util") or [0.0] * len(self._names))[s],
                "cpu_rate": (v.get("cpu_rate") or [None] * len(self._names))[s],
                "cost_per_token": self._cost(s),
                "target": (v.get("target") or [None] * len(self._names))[s],
                "need": (v.get("need") or [None] * len(self._names))[s],
                # kept above the need by down_margin (one loader fewer would not hold it)
                "held_by_margin": s in (v.get("held_by_margin") or ()),
                "pinned": self._pinned.get(s),
            })
        return {"sources": srcs, "step": v.get("step"), "step_time": v.get("step_time"),
                "wait_frac": v.get("wait_frac"), "queue_steps": v.get("queue_steps"),
                "routing_version": self._table.get("version", 0),
                "cpu_seconds_reserved": self._cpu_used,
                "slots": [{"slot": j, "actors": list(names),
                           "dedicated": (None if ded[j] is None else self._names[ded[j]]),
                           "shards": [p[:3] for p in self._table["partitions"]
                                      if int(p[3]) == j]}
                          for j, names in enumerate(self._table["slots"]) if j not in gone],
                "decisions": list(self.decisions),
                "retired_loaders": list(self.retired_loaders)}

    async def view(self) -> Dict[str, Any]:
        """Per source: its weight now, loaders (actors holding a partition of it),
        dedicated loaders, partitions, utilization, measured cost (CPU-seconds per
        token), the feed-forward need (loaders, over the horizon), the policy's target
        and a manual pin; the trainers' step time, data
        wait fraction, queue depth, the routing version, CPU-seconds reserved by
        dedicated loaders, the live slots, every decision with its reason and the
        final cost profiles of the loaders retired (``retired_loaders``)."""
        await self._ensure()
        return self.view_now()

    async def table(self) -> Dict[str, Any]:
        """The routing table in use."""
        await self._ensure()
        return self._table

    def pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
