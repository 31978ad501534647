#!/usr/bin/env python3
"""Raw text tokenized online: the tokenizer libraries' own batch calls and the loader
over them, side by side in one run, on one thread and on all the process's CPUs.

Workload: one JSON Lines source of real text from the demo corpus (data/raw/, made by
scripts/build_corpus.py: every non-empty document of --sources, fortunes up to
--fortunes), the demo's byte-level BPE data/tokenizer.json.  In each round, in alternating order:

  lib:tokenizers   ``tokenizers.Tokenizer.encode_batch_fast(batch, add_special_tokens=False)``
  lib:fastokens    ``fastokens.Tokenizer.encode_batch_flat(batch, add_special_tokens=False)``
                   batches of 64 documents; on T threads the batches are dealt to T Python
                   threads (each library's own pool held to one thread: RAYON_NUM_THREADS=1,
                   FASTOKENS_BPE_THREADS=1, as the loader holds fastokens)
  loader:tokenizers  polyload.Loader over the source, ``backend: tokenizers`` (the path
                   before fastokens), --epochs epochs (each document tokenized once an
                   epoch; the loader's run includes loading the tokenizer, the libraries'
                   runs do not), the libraries encoding the text as many times
  loader:auto      the same with ``backend: auto`` (fastokens for this file)

each with T = 1 (the loader's ``threads`` and ``tokenizer.threads`` 1) and T = every CPU
the process may use.  Figures: tokens per CPU-second of the process (getrusage: robust to
other processes on a shared machine) and wall tokens/s; the ids of both libraries are
compared document by document first.  Then ``examples/pretrain_raw.yaml`` (2 raw + 2
prepared sources, 4 ranks) before (``backend: tokenizers``, ``threads: 2`` as written) and
after (``backend: auto``, ``threads: auto``), and the loader's wall tokens/s against
``threads`` 1..CPUs (``threads`` and ``tokenizer.threads`` both T).

    .venv/bin/python bench/text/tokenizer_speed.py --rounds 5

Writes bench/results/raw/tokenizer_speed.json (records: figure, value, unit, command, machine,
date; each with its per-round values) and prints a table.
"""
import argparse
import copy
import json
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")  # fastokens' own worker threads

import numpy as np  # noqa: E402
import yaml  # noqa: E402

import polyload  # noqa: E402
import torch  # noqa: E402,F401  a training process has it imported
from polyload import _core  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def texts_of(path, n=None):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line)["text"])
                if n and len(out) >= n:
                    break
    return out


def hf_call(tok):
    def enc(batch):
        return sum(len(e.ids) + 1 for e in tok.encode_batch_fast(batch, add_special_tokens=False))
    return enc


def fast_call(tok):
    def enc(batch):
        ids, off = tok.encode_batch_flat(batch, add_special_tokens=False)
        return len(ids) // 4 + len(batch)
    return enc


def lib_run(enc, batches, threads):
    """(tokens incl. one eos per document, CPU s, wall s) of encoding every batch on
    `threads` Python threads."""
    parts = [batches[i::threads] for i in range(threads)]
    counts = [0] * threads

    def work(i):
        counts[i] = sum(enc(b) for b in parts[i])
    ths = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    c, t = cpu_s(), time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return sum(counts), cpu_s() - c, time.perf_counter() - t


def src_config(path, tokenizer, backend, steps, threads):
    return {"seed": 1, "seq_length": 2048, "global_batch_size": 8, "micro_batch_size": 8,
            "train_steps": steps, "pad_id": 1, "threads": threads, "prefetch": 2,
            "topology": {"dp": 1},
            "sources": [{"name": "raw", "type": "jsonl", "path": path, "lookahead": 512,
                         "tokenizer": {"type": "hf", "path": tokenizer, "backend": backend,
                                       "threads": threads}}]}


def loader_run(cfg, ranks=None):
    """(tokens, CPU s, wall s) of every batch of every served rank."""
    c, t = cpu_s(), time.perf_counter()
    n = 0
    with polyload.Loader(cfg, ranks=ranks) if ranks else polyload.Loader(cfg, rank=0) as ld:
        for _ in ld:
            pass
        n = ld.stats()["tokens"]
    return n, cpu_s() - c, time.perf_counter() - t


def med(xs):
    return statistics.median(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "data"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fortunes", type=int, default=15000)
    ap.add_argument("--sources", default="kernel_docs,man_i18n,python_src,fortunes")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--no-pretrain", action="store_true")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--fastokens-only", action="store_true",
                    help="only fastokens' own call and the loader over it (the overhead "
                         "figure; the tokenizers runs take most of a round)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "raw", "tokenizer_speed.json"))
    a = ap.parse_args()
    command = "bench/text/tokenizer_speed.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    import fastokens
    from tokenizers import Tokenizer

    cpus = _core.cpus_available()
    tokenizer = os.path.join(a.data, "tokenizer.json")
    texts = []
    for s in a.sources.split(","):
        texts += [t for t in texts_of(os.path.join(a.data, "raw", f"{s}.jsonl"),
                                      a.fortunes if s == "fortunes" else None) if t]
    batches = [texts[i:i + 64] for i in range(0, len(texts), 64)]
    hf = Tokenizer.from_file(tokenizer)
    ft = fastokens.Tokenizer.from_file(tokenizer)
    # the same ids, document by document
    differ = 0
    for b in batches:
        ids, off = ft.encode_batch_flat(b, add_special_tokens=False)
        ids, off = np.frombuffer(ids, np.uint32), np.frombuffer(off, np.uint64)
        for j, e in enumerate(hf.encode_batch_fast(b, add_special_tokens=False)):
            differ += ids[int(off[j]):int(off[j + 1])].tolist() != e.ids
    libs = {"tokenizers": hf_call(hf), "fastokens": fast_call(ft)}
    total = lib_run(libs["fastokens" if a.fastokens_only else "tokenizers"], batches, 1)[0]
    steps = max(1, a.epochs * total // (8 * 2048))
    batches = batches * a.epochs
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "cpus_available": cpus, "python": platform.python_version(),
               "loadavg_start": os.getloadavg(),
               "versions": {"fastokens": fastokens.__version__ if hasattr(fastokens, "__version__")
                            else "?", "tokenizers": __import__("tokenizers").__version__}}
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{len(texts)} documents, {total} tokens (with eos), ids differ in {differ}; "
          f"loader: {steps} steps of 16384 tokens ({a.epochs} epochs); CPUs available {cpus}", flush=True)
    tmp = tempfile.mkdtemp(prefix="pltokspeed.")
    src = os.path.join(tmp, "mix.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")

    ts = sorted({1, cpus})
    runs = [(f"lib:{k}", t) for k in libs for t in ts] + \
           [(f"loader:{b}", t) for b in ("tokenizers", "auto") for t in ts]
    if a.fastokens_only:
        runs = [r for r in runs if r[0] in ("lib:fastokens", "loader:auto")]
    res = {r: [] for r in runs}
    for rnd in range(a.rounds):
        order = runs if rnd % 2 == 0 else runs[::-1]
        for who, t in order:
            kind, name = who.split(":")
            if kind == "lib":
                n, c, w = lib_run(libs[name], batches, t)
            else:
                n, c, w = loader_run(src_config(src, tokenizer, name, steps, t))
            res[(who, t)].append((n / c, n / w))
        print(f"round {rnd}: " + ", ".join(
            f"{w}@{t} {res[(w, t)][-1][0]:.3g}/cpu-s {res[(w, t)][-1][1]:.3g}/s" for w, t in runs),
            flush=True)

    records = []

    def rec(figure, rounds, unit, **kw):
        records.append({"figure": figure, "value": med(rounds), "unit": unit,
                        "min": min(rounds), "max": max(rounds), "rounds": rounds,
                        "command": command, "machine": machine, "date": date, **kw})

    print("\n| run | threads | tokens per CPU-s (median, range) | wall tokens/s (median, range) |")
    print("|---|---|---|---|")
    for who, t in runs:
        cs = [x[0] for x in res[(who, t)]]
        ws = [x[1] for x in res[(who, t)]]
        rec(f"{who} tokens per CPU-second", cs, "tokens/CPU-s", threads=t)
        rec(f"{who} wall tokens/s", ws, "tokens/s", threads=t)
        print(f"| {who} | {t} | {med(cs):.3g} ({min(cs):.3g}-{max(cs):.3g}) | "
              f"{med(ws):.3g} ({min(ws):.3g}-{max(ws):.3g}) |")

    def ratio(a_, b_, i):
        return [x[i] / y[i] for x, y in zip(res[a_], res[b_])]

    print()
    for t in ts:
        pairs = [
            ("fastokens / tokenizers, library calls, per CPU-s", ("lib:fastokens", t), ("lib:tokenizers", t), 0),
            ("loader auto / loader tokenizers, per CPU-s", ("loader:auto", t), ("loader:tokenizers", t), 0),
            ("loader auto / tokenizers' encode_batch, per CPU-s", ("loader:auto", t), ("lib:tokenizers", t), 0),
            ("loader auto / fastokens' encode_batch_flat, per CPU-s (1 - overhead)", ("loader:auto", t), ("lib:fastokens", t), 0),
            ("loader tokenizers / tokenizers' encode_batch, per CPU-s", ("loader:tokenizers", t), ("lib:tokenizers", t), 0),
        ]
        for name, x, y, i in pairs:
            if x not in res or y not in res:
                continue
            r = ratio(x, y, i)
            rec(name, r, "x", threads=t)
            print(f"{name}, {t} thread{'s' if t > 1 else ''}: median {med(r):.2f} "
                  f"[{min(r):.2f}-{max(r):.2f}]", flush=True)
    if len(ts) > 1:
        for who in ("lib:tokenizers", "lib:fastokens", "loader:tokenizers", "loader:auto"):
            if (who, ts[-1]) not in res:
                continue
            r = ratio((who, ts[-1]), (who, 1), 1)
            rec(f"{who} wall scaling {ts[-1]} threads over 1", r, "x")
            print(f"{who} wall speed-up {ts[-1]} threads / 1: median {med(r):.2f} "
                  f"[{min(r):.2f}-{max(r):.2f}]", flush=True)

    if not a.no_pretrain:
        with open(os.path.join(ROOT, "examples", "pretrain_raw.yaml")) as f:
            base = yaml.safe_load(f)
        os.chdir(ROOT)
        before = copy.deepcopy(base)
        after = copy.deepcopy(base)
        for c, backend in ((before, "tokenizers"), (after, "auto")):
            c["tokenizer"]["backend"] = backend
            for s in c["sources"]:
                if "tokenizer" in s:
                    s["tokenizer"]["backend"] = backend
        after.pop("threads", None)  # auto
        for s in after["sources"]:
            if "tokenizer" in s:
                s["tokenizer"].pop("threads", None)
        ranks = list(range(base["topology"]["dp"]))
        pr = {"before": [], "after": []}
        for rnd in range(a.rounds):
            for k in (("before", "after") if rnd % 2 == 0 else ("after", "before")):
                n, c, w = loader_run(before if k == "before" else after, ranks)
                pr[k].append((n / c, n / w))
        print("\nexamples/pretrain_raw.yaml, 4 ranks served by one Loader:")
        for k, label in (("before", "backend: tokenizers, threads: 2 (as written)"),
                         ("after", "backend: auto, threads: auto")):
            cs = [x[0] for x in pr[k]]
            ws = [x[1] for x in pr[k]]
            rec(f"pretrain_raw.yaml {k} tokens per CPU-second", cs, "tokens/CPU-s", setting=label)
            rec(f"pretrain_raw.yaml {k} wall tokens/s", ws, "tokens/s", setting=label)
            print(f"  {k:6s} ({label}): {med(cs):.3g} tokens per CPU-s [{min(cs):.3g}-{max(cs):.3g}], "
                  f"{med(ws):.3g} tokens/s [{min(ws):.3g}-{max(ws):.3g}]")
        r = [x[1] / y[1] for x, y in zip(pr["after"], pr["before"])]
        rec("pretrain_raw.yaml after / before, wall", r, "x")
        print(f"  after / before, wall: median {med(r):.2f} [{min(r):.2f}-{max(r):.2f}]")

    if not a.no_scaling and cpus > 1:
        counts = list(range(1, cpus + 1))
        sc = {t: [] for t in counts}
        for rnd in range(a.rounds):
            for t in (counts if rnd % 2 == 0 else counts[::-1]):
                n, c, w = loader_run(src_config(src, tokenizer, "auto", steps, t))
                sc[t].append(n / w)
        print("\nloader (backend auto) wall tokens/s against threads:")
        for t in counts:
            rec("loader wall tokens/s by threads", sc[t], "tokens/s", threads=t)
            print(f"  threads {t}: {med(sc[t]):.3g} [{min(sc[t]):.3g}-{max(sc[t]):.3g}]")
        for t in counts[1:]:
            r = [x / y for x, y in zip(sc[t], sc[t - 1])]
            rec(f"loader wall tokens/s, threads {t} over {t - 1}", r, "x")
            print(f"  threads {t} / {t - 1}: median {med(r):.2f} [{min(r):.2f}-{max(r):.2f}] "
                  f"({sum(x >= 1 for x in r)} of {len(r)} rounds >= 1)")
    machine["loadavg_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"records": records}, f, indent=1)
    print("wrote", os.path.relpath(a.out, ROOT))


if __name__ == "__main__":
    main()
