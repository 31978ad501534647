"""Run a config through a Ray deployment on a fresh single-node Ray instance and
write the batch hashes of every rank as JSON; run by
tests/python/test_remote_sources.py in its own process, so that the Ray workers
inherit this process's environment (the object store's endpoint, the cache
directory) and no other Ray instance of the test session is touched.

    python ray_run.py CONFIG.yaml RANKS OUT.json
"""
import json
import os
import sys

import ray
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
from conftest import batch_hash  # noqa: E402
import polyload.ray as pr  # noqa: E402


def main():
    cfg = yaml.safe_load(open(sys.argv[1]))
    ranks = int(sys.argv[2])
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
             object_store_memory=128 << 20, namespace="plremote")
    try:
        with pr.launch(cfg, num_source_loaders=2, num_constructors=1, namespace="plremote",
                       name="remote"):
            clients = [pr.Client(cfg, rank=r, namespace="plremote", name="remote")
                       for r in range(ranks)]
            got = {r: [] for r in range(ranks)}
            while True:
                b = [c.next_batch() for c in clients]
                if b[0] is None:
                    break
                for r in range(ranks):
                    got[r].append(batch_hash(b[r]))
            for c in clients:
                c.close()
    finally:
        ray.shutdown()
    with open(sys.argv[3], "w") as f:
        json.dump(got, f)


if __name__ == "__main__":
    main()
