"""``polyload serve CONFIG --ray-address ADDR``: run a deployment until interrupted.

Connects to a running Ray cluster, launches the actors of :func:`polyload.ray.launch`,
prints one JSON line describing the deployment (namespace, actor names, nodes), then
waits for SIGINT or SIGTERM and shuts the actors down.  Exit codes as the CLI's: 0 ok,
1 runtime or data error, 2 usage or config error.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import List, Optional


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="polyload serve",
        description="Run polyload's source loaders, planner and data constructors as Ray "
                    "actors until interrupted; trainers connect with polyload.ray.Client.")
    p.add_argument("config", help="YAML config (SPEC section 5)")
    p.add_argument("--ray-address", required=True, help="address of the Ray cluster (or 'auto')")
    p.add_argument("--num-source-loaders", type=int, default=1, metavar="N",
                   help="partitions (source loader actors) per source (default 1)")
    p.add_argument("--num-constructors", type=int, default=1, metavar="M",
                   help="data constructors, one per group of DP ranks (default 1)")
    p.add_argument("--constructor-shadows", type=int, default=1, metavar="K",
                   help="warm standbys per constructor (default 1)")
    p.add_argument("--max-source-loader-actors", type=int, default=None, metavar="K",
                   help="host the partitions on at most K actors")
    p.add_argument("--prefetch-steps", type=int, default=None, metavar="S")
    p.add_argument("--autoscale", nargs="?", const="{}", default=None, metavar="JSON",
                   help="size source-loader pools by measured cost ahead of the schedule; "
                        "optional JSON of launch's autoscale keys, e.g. "
                        "'{\"max_loaders\": 4, \"cpu_budget\": 16}' (watch: polyload top)")
    p.add_argument("--num-cpus", action="append", default=[], metavar="ROLE=N",
                   help="CPUs a role asks Ray for (planner, source_loader, constructor; "
                        "repeatable); by default the requests are scaled down to fit a "
                        "small cluster")
    p.add_argument("--namespace", default="polyload")
    p.add_argument("--name", default="polyload")
    return p


def serve(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``polyload serve`` (also ``python -m polyload serve``)."""
    args = _parser().parse_args(argv)
    # stdout carries the one JSON line only: Ray's own messages (raylet warnings, which
    # it prints to the driver's sys.stdout) go to stderr.
    out, sys.stdout = sys.stdout, sys.stderr
    try:
        return _serve(args, out)
    finally:
        sys.stdout = out


def _serve(args, out) -> int:
    import ray

    import polyload

    from ._deploy import launch
    from ._failure import set_failure_detection_env

    set_failure_detection_env()  # read by Ray when it starts in this process
    try:
        ray.init(address=args.ray_address, namespace=args.namespace, include_dashboard=False,
                 log_to_driver=False)
    except Exception as e:  # noqa: BLE001
        sys.stderr.write(f"polyload serve: cannot connect to Ray at {args.ray_address}: {e}\n")
        return 1
    autoscale = None
    if args.autoscale is not None:
        try:
            autoscale = json.loads(args.autoscale)
        except ValueError as e:
            sys.stderr.write(f"polyload serve: --autoscale: not JSON: {e}\n")
            return 2
    placement = {}
    for item in args.num_cpus:
        role, _, n = item.partition("=")
        try:
            placement[role] = {"num_cpus": float(n)}
        except ValueError:
            sys.stderr.write(f"polyload serve: --num-cpus {item}: expected ROLE=N\n")
            return 2
    try:
        dep = launch(args.config, autoscale=autoscale, placement=placement or None, num_source_loaders=args.num_source_loaders,
                     num_constructors=args.num_constructors, namespace=args.namespace,
                     name=args.name, max_source_loader_actors=args.max_source_loader_actors,
                     prefetch_steps=args.prefetch_steps,
                     constructor_shadows=args.constructor_shadows)
    except (polyload.ConfigError, ValueError, TypeError) as e:
        sys.stderr.write(f"polyload serve: {e}\n")
        return 2
    except (polyload.PolyloadError, OSError) as e:
        sys.stderr.write(f"polyload serve: {e}\n")
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    info = dep.info
    print(json.dumps({"namespace": dep.namespace, "name": dep.name, **{
        k: info[k] for k in ("constructors", "dp_groups", "source_loaders", "nodes", "pids")}}),
        file=out, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        dep.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
