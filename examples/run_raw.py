#!/usr/bin/env python3
"""Run a config through the embedded loader for every rank and print its summary.

For configs with raw text sources tokenized by a Hugging Face tokenizer (the C CLI's
``polyload run`` has no Python, so only the built-in ``bytes`` tokenizer); the summary
has the fields of ``polyload run --json`` (SPEC section 6) plus time to first batch.

    .venv/bin/python examples/run_raw.py examples/pretrain_raw.yaml
"""
import json
import sys
import time

import polyload
from polyload import _core


def main(path):
    t0 = time.perf_counter()
    cfg = _core.Config.parse_file(path)
    ranks = list(range(cfg.world_size()))
    first = None
    with polyload.Loader(path, rank=0, ranks=ranks) as loader:
        done = False
        while not done:
            for r in ranks:
                b = loader.next_batch(r)
                if b is None:
                    done = True
                    break
                if first is None:
                    first = time.perf_counter() - t0
        stats = loader.stats()
    stats["time_to_first_batch_s"] = round(first or 0.0, 3)
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples/pretrain_raw.yaml")
