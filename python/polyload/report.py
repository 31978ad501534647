"""``polyload report CONFIG --steps A:B --out report.html|png``: a picture of the plan.

The data come from the C planner itself (``polyload._core.Planner``, the object behind
``polyload plan --json``), from metadata only: no token is read.  Per step ``s`` of
``[A, B)``:

- mixture: the fraction of the step's non-padding tokens drawn from each source, against
  the schedule's weight at ``s`` (``pl_config_source_weight``), per step and cumulative
  from step A (the cumulative schedule is the schedule weighted by each step's tokens);
- balance: the largest DP rank's cost over the step's lower bound (``pl_plan.lower_bound``:
  max(total cost / dp, costliest chunk)), 1.0 being perfect;
- mixture deviation: the largest gap between a source's share of the step's tokens and its
  weight (with ``balance_window`` the mixture is exact over each window, not per step);
- bound by a chunk: whether the step's lower bound is one chunk costlier than the mean
  rank (a long document that only context parallelism for its sequence can shorten);
- padding: the fraction of the step's ``global_batch_size * seq_length`` slots that hold
  no token (row ends and CP padding);
- epochs per source: documents started so far (from step 0, or from ``--state-in``'s step)
  over the source's documents.

``--json`` prints the data (one object) instead of, or besides, the picture.  The HTML is
one self-contained file (the figure as an embedded PNG, a per-source table and the data as
JSON); drawing needs matplotlib.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import sys
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["collect", "render", "main"]


def _parse_steps(text: str):
    a, sep, b = text.partition(":")
    if not sep:
        return 0, int(text)
    return int(a), int(b)


def collect(config: Any, start: int, stop: int, state: Optional[bytes] = None,
            progress: Optional[Any] = None) -> Dict[str, Any]:
    """The report's data for steps ``[start, stop)``.

    Args:
        config: a path, dict or ``_core.Config``.
        start, stop: zero-based, half-open, absolute step numbers (as ``polyload plan``).
        state: a state blob to start from (``--state-in``); its step must be <= start.
        progress: called as ``progress(done, total)`` after each planned step.

    Returns a dict: ``sources`` (names), ``num_documents``, ``steps`` (list), per step
    lists ``tokens``, ``padding_fraction``, ``max_over_lower_bound``, ``realized``
    (per-source fractions), ``scheduled``, ``cumulative_realized``,
    ``cumulative_scheduled``, ``epochs`` (per source, at the end of the step),
    ``mixture_deviation``, ``bound_by_chunk``, plus
    ``seq_length``, ``global_batch_size``, ``dp``.

    Raises:
        ValueError: an empty range, or a state past ``start``.
        PolyloadError: as the planner (a config, source or state error).
    """
    from ._config import _make_config  # noqa: PLC0415
    from ._extension import _require_core  # noqa: PLC0415

    core = _require_core()
    if not 0 <= start < stop:
        raise ValueError(f"polyload report: --steps wants A:B with 0 <= A < B, got "
                         f"{start}:{stop}")
    cfg = _make_config(config)
    for w in cfg.warnings:
        sys.stderr.write(f"polyload: warning: {w}\n")
    planner = core.Planner.create(cfg)
    names = [cfg.source_name(i) for i in range(cfg.num_sources)]
    # the documents the planner draws from (a source's train range under `split`)
    ndocs = [s["num_documents"] for s in core.state_info(planner.get_state())["sources"]]
    n = len(names)
    started = [0] * n
    step = 0
    if state is not None:
        planner.set_state(state)
    out: Dict[str, Any] = {
        "sources": names, "num_documents": ndocs, "steps": [], "tokens": [],
        "padding_fraction": [], "max_over_lower_bound": [], "realized": [],
        "scheduled": [], "cumulative_realized": [], "cumulative_scheduled": [],
        "epochs": [], "mixture_deviation": [], "bound_by_chunk": [],
        "seq_length": cfg.get_int("seq_length"),
        "global_batch_size": cfg.get_int("global_batch_size"),
        "dp": cfg.get_int("topology.dp"),
    }
    cum_tok = [0] * n
    cum_sched = [0.0] * n
    cum_total = 0
    slots = out["seq_length"] * out["global_batch_size"]
    first = True
    while True:
        plan = planner.next()
        step = plan["step"]
        if first and step > start:
            raise ValueError(f"polyload report: the state is at step {step}, past the "
                             f"range start {start}")
        first = False
        chunks = plan["chunks"]
        import numpy as np  # noqa: PLC0415

        ch = np.asarray(chunks).reshape(-1, 5)  # source, index, offset, length, flags
        per = np.bincount(ch[:, 0], weights=ch[:, 3], minlength=n).astype(np.int64)
        new_docs = np.bincount(ch[ch[:, 2] == 0, 0], minlength=n)
        for i in range(n):
            started[i] += int(new_docs[i])
        if step < start:
            continue
        total = int(per.sum())
        assert total == plan["tokens"], "chunk lengths must add up to the plan's tokens"
        sched = [cfg.source_weight(i, step) for i in range(n)]
        cum_total += total
        for i in range(n):
            cum_tok[i] += int(per[i])
            cum_sched[i] += sched[i] * total
        rank_cost = np.asarray(plan["rank_cost"])
        lb = plan["lower_bound"]
        out["steps"].append(step)
        out["tokens"].append([int(x) for x in per])
        out["padding_fraction"].append(1.0 - total / slots)
        out["max_over_lower_bound"].append(float(rank_cost.max() / lb) if lb > 0 else 1.0)
        out["realized"].append([int(x) / total if total else 0.0 for x in per])
        out["mixture_deviation"].append(max(abs(r - w) for r, w in
                                            zip(out["realized"][-1], sched)) if n else 0.0)
        out["bound_by_chunk"].append(bool(lb > rank_cost.sum() / len(rank_cost) * (1 + 1e-12)))
        out["scheduled"].append(sched)
        out["cumulative_realized"].append([t / cum_total if cum_total else 0.0
                                           for t in cum_tok])
        out["cumulative_scheduled"].append([s / cum_total if cum_total else 0.0
                                            for s in cum_sched])
        out["epochs"].append([started[i] / ndocs[i] if ndocs[i] else 0.0 for i in range(n)])
        if progress is not None:
            progress(step - start + 1, stop - start)
        if step + 1 >= stop:
            break
    return out


def _figure(data: Dict[str, Any]):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    steps = data["steps"]
    names = data["sources"]
    fig, ax = plt.subplots(3, 2, figsize=(13, 12), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (key, title) in enumerate((("realized", "mixture per step"),
                                      ("cumulative_realized", "mixture, cumulative"))):
        a = ax[0, k]
        sched_key = "scheduled" if key == "realized" else "cumulative_scheduled"
        for i, name in enumerate(names):
            c = colors[i % len(colors)]
            a.plot(steps, [r[i] for r in data[key]], color=c, label=f"{name} realized")
            a.plot(steps, [r[i] for r in data[sched_key]], color=c, linestyle="--",
                   label=f"{name} schedule")
        a.set_title(title + " (fraction of tokens; dashed: schedule)")
        a.set_xlabel("step")
        a.set_ylim(0, 1)
    ax[0, 0].legend(fontsize="small", ncol=2)
    a = ax[1, 0]
    a.plot(steps, data["max_over_lower_bound"])
    a.axhline(1.0, color="grey", linewidth=0.8)
    a.set_title("largest DP rank cost / lower bound")
    a.set_xlabel("step")
    a = ax[1, 1]
    a.plot(steps, data["padding_fraction"])
    a.set_title("padding fraction per step")
    a.set_xlabel("step")
    a.set_ylim(bottom=0)
    a = ax[2, 0]
    for i, name in enumerate(names):
        a.plot(steps, [e[i] for e in data["epochs"]], label=name)
    a.set_title("epochs per source (documents started / documents)")
    a.set_xlabel("step")
    a.legend(fontsize="small")
    a = ax[2, 1]
    a.bar(range(len(names)), data["epochs"][-1])
    a.set_xticks(range(len(names)), names, rotation=30, ha="right")
    a.set_title(f"epochs per source at step {steps[-1]}")
    return fig, plt


def render(data: Dict[str, Any], path: str) -> None:
    """Write the report to ``path``: ``.png`` (the figure) or ``.html`` (figure, table and
    data in one file).  Needs matplotlib."""
    fig, plt = _figure(data)
    try:
        if path.endswith(".png"):
            fig.savefig(path, dpi=90)
            return
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
    finally:
        plt.close(fig)
    png = base64.b64encode(buf.getvalue()).decode()
    rows = []
    last = len(data["steps"]) - 1
    for i, name in enumerate(data["sources"]):
        rows.append(
            "<tr><td>{}</td><td>{}</td><td>{:.4f}</td><td>{:.4f}</td><td>{:.3f}</td></tr>"
            .format(html.escape(name), data["num_documents"][i],
                    data["cumulative_scheduled"][last][i],
                    data["cumulative_realized"][last][i], data["epochs"][last][i]))
    a, b = data["steps"][0], data["steps"][-1] + 1
    doc = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>polyload report, steps {a}:{b}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:2px 10px;text-align:right}}
</style></head><body>
<h1>polyload report, steps {a}:{b}</h1>
<p>global_batch_size {data['global_batch_size']}, seq_length {data['seq_length']},
dp {data['dp']}; mean padding {sum(data['padding_fraction']) / len(data['steps']):.4f};
mean largest rank cost / lower bound
{sum(data['max_over_lower_bound']) / len(data['steps']):.5f};
largest mixture deviation of a step {max(data.get('mixture_deviation') or [0.0]):.4f};
steps bound by one chunk (only context parallelism shortens them)
{sum(data.get('bound_by_chunk') or [])}</p>
<table><tr><th>source</th><th>documents</th><th>scheduled (cum.)</th>
<th>realized (cum.)</th><th>epochs</th></tr>
{''.join(rows)}
</table>
<img alt="mixture, balance, padding and epochs per step" src="data:image/png;base64,{png}">
<script type="application/json" id="polyload-report-data">{json.dumps(data)}</script>
</body></html>
"""
    with open(path, "w") as f:
        f.write(doc)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="polyload report", description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--steps", required=True, help="A:B, zero-based and half-open (or N = 0:N)")
    p.add_argument("--out", help="report.html or report.png")
    p.add_argument("--state-in", help="start from this state blob (polyload run --state-out)")
    p.add_argument("--json", action="store_true", help="print the data as one JSON object")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(list(argv) if argv is not None else None)
    from . import PolyloadError  # noqa: PLC0415

    try:
        start, stop = _parse_steps(args.steps)
    except ValueError:
        sys.stderr.write(f"polyload: error: --steps wants A:B, got {args.steps!r}\n")
        return 2
    if not args.out and not args.json:
        sys.stderr.write("polyload: error: report: give --out PATH (.html or .png) or --json\n")
        return 2
    if args.out and not (args.out.endswith(".html") or args.out.endswith(".png")):
        sys.stderr.write(f"polyload: error: --out must end in .html or .png, got {args.out!r}\n")
        return 2
    state = None
    if args.state_in:
        try:
            with open(args.state_in, "rb") as f:
                state = f.read()
        except OSError as e:
            sys.stderr.write(f"polyload: error: --state-in {args.state_in}: {e.strerror}\n")
            return 1
    show = not args.no_progress and sys.stderr.isatty()

    def progress(done, total):
        if show:
            sys.stderr.write(f"\r{done}/{total} steps planned")
            if done == total:
                sys.stderr.write("\n")

    try:
        data = collect(args.config, start, stop, state=state, progress=progress)
    except ValueError as e:
        sys.stderr.write(f"polyload: error: {e}\n")
        return 2
    except PolyloadError as e:
        sys.stderr.write(f"polyload: error: {e.message}\n")
        return 2 if e.name in ("ECONFIG", "ETOPOLOGY") else 1
    if args.json:
        sys.stdout.write(json.dumps(data) + "\n")
    if args.out:
        render(data, args.out)
    return 0
