#!/usr/bin/env python3
"""Raw text tokenized online in the Ray deployment: tokens/s against the number
of source loader actors that tokenize one source.

One ``type: jsonl`` source of real text (800 kernel_docs and 15,000 fortunes of the demo
corpus, data/raw/, as bench/text/text_tokenize.py), Hugging Face tokenizer data/tokenizer.json,
split into N index-range partitions on N source loader actors
(``launch(num_source_loaders={"raw": N})``, no standbys); one constructor; 8 trainer
ranks (``polyload.ray.Client`` in threads of this process) take every micro-batch of
``--epochs`` epochs (default 5) as fast as they can.  The clock runs from the clients'
start to the last batch; each epoch tokenizes every document once, in the actor owning
it (no length-cache sidecar is written), and what the actors tokenized during
``launch`` (the first steps' lookahead) is outside the clock, so the epochs after the
first are what it measures.  Non-padding tokens are counted from
``loss_mask``.  Paired rounds, the actor counts in alternating order; speed-up against the
first count.  A local Ray instance with 8 logical CPUs; on this machine they share 2 cores.

    RAYON_NUM_THREADS=1 .venv/bin/python bench/ray/ray_text_scaling.py [--actors 1,2] [--rounds 3]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import ROOT, machine_note  # noqa: E402

NS = "polyload_text_scaling"
SEQ, GBS, DP = 2048, 32, 8


def write_source(data, path, kernel_docs, fortunes):
    n = 0
    with open(path, "w", encoding="utf-8") as out:
        for name, k in (("kernel_docs", kernel_docs), ("fortunes", fortunes)):
            with open(os.path.join(data, "raw", f"{name}.jsonl"), encoding="utf-8") as f:
                for i, line in enumerate(f):
                    if i >= k:
                        break
                    if line.strip():
                        out.write(line if line.endswith("\n") else line + "\n")
                        n += 1
    return n


def config(path, tokenizer, steps):
    return {"seed": 1, "seq_length": SEQ, "global_batch_size": GBS, "micro_batch_size": 1,
            "train_steps": steps, "pad_id": 1, "dtype": "int32", "topology": {"dp": DP},
            "sources": [{"name": "raw", "type": "jsonl", "path": path,
                         "tokenizer": {"type": "hf", "path": tokenizer, "add_eos": True,
                                       "threads": 1}}]}


def run(cfg, n_actors, name):
    import polyload.ray as pr

    dep = pr.launch(cfg, num_source_loaders={"raw": n_actors}, namespace=NS, name=name,
                    shadows=0, constructor_shadows=0)
    try:
        t0 = time.perf_counter()
        clients = [pr.Client(cfg, rank=r, namespace=NS, name=name) for r in range(DP)]
        tokens = [0] * DP
        errors = []

        def rank(r):
            try:
                for b in clients[r]:
                    tokens[r] += int(b["loss_mask"].sum())
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"rank {r}: {type(e).__name__}: {e}")

        th = [threading.Thread(target=rank, args=(r,)) for r in range(DP)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        for c in clients:
            c.close()
        if errors:
            raise RuntimeError("; ".join(errors))
    finally:
        dep.shutdown()
    return sum(tokens), wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "data"))
    ap.add_argument("--actors", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kernel-docs", type=int, default=800)
    ap.add_argument("--fortunes", type=int, default=15000)
    ap.add_argument("--epochs", type=float, default=5.0,
                    help="epochs of the source consumed (each tokenizes every document "
                         "again: lengths and tokens are not kept across epochs)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import ray
    from tokenizers import Tokenizer

    counts = [int(x) for x in a.actors.split(",")]
    tokenizer = os.path.join(a.data, "tokenizer.json")
    tmp = tempfile.mkdtemp(prefix="pltextscale.")
    try:
        src = os.path.join(tmp, "mix.jsonl")
        write_source(a.data, src, a.kernel_docs, a.fortunes)
        tok = Tokenizer.from_file(tokenizer)
        with open(src, encoding="utf-8") as f:
            total = sum(len(e.ids) + 1 for e in tok.encode_batch_fast(
                [json.loads(x)["text"] for x in f], add_special_tokens=False))
        steps = max(1, int(total * a.epochs) // (GBS * SEQ))
        print(f"{total} tokens in the source; {steps} steps of {GBS * SEQ} tokens", flush=True)
        ray.init(num_cpus=8, include_dashboard=False, namespace=NS, log_to_driver=False,
                 object_store_memory=512 << 20)
        rows = []
        try:
            for r in range(a.rounds):
                order = counts if r % 2 == 0 else list(reversed(counts))
                res = {}
                for n in order:
                    got, wall = run(config(src, tokenizer, steps), n, f"ts{n}_{r}")
                    res[n] = {"tokens": got, "wall_s": wall, "tokens_per_s": got / wall}
                rows.append(res)
                print(f"round {r}: " + ", ".join(
                    f"{n} actor{'s' if n > 1 else ''} {res[n]['tokens_per_s']:.4g} tokens/s "
                    f"({res[n]['wall_s']:.2f} s)" for n in counts) + ", speed-up " +
                    ", ".join(f"{res[n]['tokens_per_s'] / res[counts[0]]['tokens_per_s']:.2f}x"
                              for n in counts[1:]), flush=True)
        finally:
            ray.shutdown()
        for n in counts[1:]:
            sp = sorted(x[n]["tokens_per_s"] / x[counts[0]]["tokens_per_s"] for x in rows)
            print(f"median speed-up {n} vs {counts[0]} actors: {sp[len(sp) // 2]:.2f}x",
                  flush=True)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"machine": machine_note(), "args": vars(a), "rounds":
                           [{str(k): v for k, v in x.items()} for x in rows]}, fh, indent=1)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
