"""Run a config through a Ray deployment on a fresh single-node Ray instance and
write the batch hashes of every rank as JSON; run by
tests/python/test_remote_sources.py in its own process, so that the Ray workers
inherit this process's environment (the object store's endpoint, the cache
directory) and no other Ray instance of the test session is touched.

    python ray_run.py CONFIG.yaml RANKS OUT.json [KILL_AT]

With KILL_AT, the first source loader's process is killed (SIGKILL) after the
KILL_AT-th micro-batch of every rank, and the killed count is written too.
"""
import json
import os
import signal
import sys
import time

import ray
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
from conftest import batch_hash  # noqa: E402
import polyload.ray as pr  # noqa: E402


def main():
    cfg = yaml.safe_load(open(sys.argv[1]))
    ranks = int(sys.argv[2])
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    killed = 0
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
             object_store_memory=128 << 20, namespace="plremote")
    try:
        with pr.launch(cfg, num_source_loaders=2, num_constructors=1, namespace="plremote",
                       name="remote") as dep:
            clients = [pr.Client(cfg, rank=r, namespace="plremote", name="remote")
                       for r in range(ranks)]
            got = {r: [] for r in range(ranks)}
            while True:
                b = [c.next_batch() for c in clients]
                if b[0] is None:
                    break
                for r in range(ranks):
                    got[r].append(batch_hash(b[r]))
                if kill_at is not None and len(got[0]) == kill_at:
                    loader = dep.actors["source_loader"][0]
                    pid = int(ray.get(loader.pid.remote(), timeout=60))
                    os.kill(pid, signal.SIGKILL)
                    deadline = time.time() + 30
                    while time.time() < deadline:
                        try:
                            os.kill(pid, 0)
                        except ProcessLookupError:
                            killed += 1
                            break
                        time.sleep(0.05)
            for c in clients:
                c.close()
    finally:
        ray.shutdown()
    if kill_at is not None:
        got["killed"] = killed
    with open(sys.argv[3], "w") as f:
        json.dump(got, f)


if __name__ == "__main__":
    main()
