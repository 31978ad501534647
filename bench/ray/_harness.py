"""What the Ray benchmarks (bench/ray/*.py) share: paths, a local Ray instance with the
settings every one of them uses, the machine note, and writing results.

A benchmark puts its own folder first on sys.path and imports from here:

    HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, HERE)
    from _harness import OUT, ROOT, machine_note, start_ray, save_results

Raw output goes to bench/out/ (git-ignored); the figures a run measured go to
bench/results/<name>.json through bench/results.py.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
OUT = os.path.join(BENCH, "out")
if BENCH not in sys.path:
    sys.path.insert(1, BENCH)

import results  # noqa: E402
from _common import machine_note, proc_cpu_seconds  # noqa: E402,F401

MiB = 1 << 20


def start_ray(num_cpus: int = 8, object_store_mib: int = 256, namespace: str = "bench",
              **kwargs):
    """Start a local Ray instance as the benchmarks run it: no dashboard, no driver logs,
    `num_cpus` logical CPUs and a small object store.  Returns ray.init's context."""
    import ray
    kwargs.setdefault("address", "local")
    return ray.init(num_cpus=num_cpus, include_dashboard=False,
                    object_store_memory=object_store_mib * MiB, namespace=namespace,
                    log_to_driver=False, **kwargs)


def write_json(path: str, res) -> None:
    """Write a raw result file under bench/out/ (its folder created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)


def save_results(name: str, figures: list) -> str:
    """Record (figure, value, unit, extra...) tuples in bench/results/NAME.json."""
    recs = [results.record(f[0], f[1], f[2], **(f[3] if len(f) > 3 else {})) for f in figures]
    return results.write(name, recs)
