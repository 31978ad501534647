"""``polyload top --ray-address ADDR [--name NAME]``: a live view of a deployment's
source-loader pools (issue "Source loaders that scale with the work").

Every ``--interval`` seconds it prints, from the deployment's autoscaler
(:meth:`polyload.ray.Deployment.scaling`): per source its weight now, loaders (actors
holding a partition of it; ``dedicated`` of them its own), partitions, utilization
(busy fraction), the CPU its loaders got (CPU-seconds per second), measured cost
(CPU-microseconds per token), the policy's target and a
manual pin; the trainers' compute step time, data wait and queue depth; and the last
scaling decisions with their reasons.  ``--once`` prints one view and exits;
``--json`` prints the view as one JSON object per line instead.  Exit codes: 0 ok,
1 no such deployment or Ray unreachable, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Optional


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polyload top",
                                description="Live view of a polyload deployment's source "
                                            "loaders and scaling decisions.")
    p.add_argument("--ray-address", default="auto", help="Ray cluster address (default auto)")
    p.add_argument("--namespace", default="polyload")
    p.add_argument("--name", default="polyload", help="the deployment's name (launch's name)")
    p.add_argument("--interval", type=float, default=2.0, metavar="S")
    p.add_argument("--once", action="store_true", help="print one view and exit")
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.add_argument("--decisions", type=int, default=8, metavar="N",
                   help="last N decisions shown (default 8)")
    return p


def _fmt(x: Optional[float], scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def render(view: Dict[str, Any], decisions: int = 8) -> str:
    """The text table of one :meth:`Deployment.scaling` view."""
    lines: List[str] = []
    lines.append(
        f"step {view.get('step')}  compute step {_fmt(view.get('step_time'), 1e3, 1)} ms  "
        f"data wait {_fmt(view.get('wait_frac'), 100, 1)} %  queue {view.get('queue_steps')} "
        f"steps  routing v{view.get('routing_version')}  loader CPU-s "
        f"{_fmt(view.get('cpu_seconds_reserved'), 1, 1)}")
    head = f"{'source':<16}{'weight':>8}{'loaders':>9}{'dedic.':>8}{'parts':>7}" \
           f"{'util':>7}{'cpu':>6}{'us/token':>10}{'target':>8}{'pinned':>8}"
    lines += [head, "-" * len(head)]
    for s in view["sources"]:
        lines.append(f"{s['source'][:15]:<16}{s['weight']:>8.3f}{s['loaders']:>9}"
                     f"{s['dedicated']:>8}{s['partitions']:>7}{_fmt(s['util']):>7}"
                     f"{_fmt(s.get('cpu_rate')):>6}"
                     f"{_fmt(s['cost_per_token'], 1e6, 3):>10}"
                     f"{'-' if s['target'] is None else s['target']:>8}"
                     f"{'-' if s['pinned'] is None else s['pinned']:>8}")
    decs = view.get("decisions") or []
    if decs:
        lines.append("")
        lines.append("decisions (newest last):")
        for d in decs[-decisions:]:
            when = time.strftime("%H:%M:%S", time.localtime(d["time"]))
            lines.append(f"  {when} step {d.get('step')} {d.get('source')}: "
                         f"{d.get('from')} -> {d.get('to')}  {d.get('reason')}")
    return "\n".join(lines)


def top(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``polyload top`` (also ``python -m polyload top``)."""
    args = _parser().parse_args(argv)
    import ray

    from . import _registry
    from ._failure import set_failure_detection_env

    set_failure_detection_env()  # read by Ray when it starts in this process
    try:
        ray.init(address=args.ray_address, namespace=args.namespace, include_dashboard=False,
                 log_to_driver=False)
    except Exception as e:  # noqa: BLE001
        sys.stderr.write(f"polyload top: cannot connect to Ray at {args.ray_address}: {e}\n")
        return 1
    try:
        try:
            scaler = ray.get_actor(_registry.autoscaler(args.name), namespace=args.namespace)
        except ValueError:
            sys.stderr.write(f"polyload top: no deployment {args.namespace}/{args.name} "
                             f"(no actor {_registry.autoscaler(args.name)})\n")
            return 1
        tty = sys.stdout.isatty() and not args.json
        while True:
            try:
                view = ray.get(scaler.view.remote(), timeout=30)
            except Exception as e:  # noqa: BLE001 - the deployment went away
                sys.stderr.write(f"polyload top: {args.namespace}/{args.name}: {e}\n")
                return 1
            if args.json:
                print(json.dumps(view), flush=True)
            else:
                if tty:
                    sys.stdout.write("\x1b[H\x1b[2J")
                print(render(view, args.decisions), flush=True)
            if args.once:
                return 0
            time.sleep(max(0.1, args.interval))
    except KeyboardInterrupt:
        return 0
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(top())
