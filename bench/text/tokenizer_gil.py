#!/usr/bin/env python3
"""Does each tokenizer library release the GIL while it encodes, and what does its batch
call cost per CPU-second on a fresh tokenizer?

For each candidate of tokenizer_parity.py and each --files tokenizer file it loads (the
tiktoken-style ones: cl100k and o200k only): a Python thread counts in a loop while the
main thread makes one batch call on a fresh tokenizer (8 documents of 100 corpus
documents each); the count per second
during the call, over the count per second with the main thread idle, is near 1 when the
call releases the GIL and near 0 when it holds it.  Then tokens per CPU-second
(getrusage, all threads) of the whole demo corpus in batches of 64 through the library's
fastest batch call (`Candidate.encode_native`), on a freshly loaded tokenizer (pass 0) and
again (pass 1: caches warm), and the CPU-seconds of loading the file.

    .venv/bin/python bench/text/tokenizer_gil.py [--files demo_bpe32k,cl100k_base,o200k_base]

Writes bench/results/raw/tokenizer_gil.json (records: figure, value, unit, command, machine,
date).
"""
import json
import os
import platform
import resource
import sys
import threading
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_parity as tp  # noqa: E402


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def counter_rate(work, seconds=None):
    """Counts per second of a Python loop on another thread while work() runs (or for
    `seconds` with nothing else running)."""
    stop, n = [False], [0]

    def spin():
        while not stop[0]:
            n[0] += 1
    th = threading.Thread(target=spin)
    th.start()
    t0 = time.perf_counter()
    if work is None:
        time.sleep(seconds)
    else:
        work()
    dt = time.perf_counter() - t0
    stop[0] = True
    th.join()
    return n[0] / dt, dt


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", default="demo_bpe32k,cl100k_base,o200k_base")
    a = ap.parse_args()
    files = {f[0]: f for f in tp.tokenizer_files(with_claude=False)}
    texts = [t for _, t in tp.corpus_documents() if t]
    batches = [texts[i:i + 64] for i in range(0, len(texts), 64)]
    big = ["\n".join(texts[i * 100:(i + 1) * 100]) for i in range(8)]
    alone = max(counter_rate(None, 0.5)[0] for _ in range(3))
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    machine = {"cpu": platform.machine(), "cores": os.cpu_count(),
               "affinity": len(os.sched_getaffinity(0)), "loadavg": os.getloadavg()}
    command = "bench/text/tokenizer_gil.py " + " ".join(sys.argv[1:])
    records = []
    print(f"counter alone: {alone:.3g}/s; {len(texts)} documents", flush=True)
    for fname in a.files.split(","):
      for c in tp.CANDIDATES:
        name, path, _, tk = files[fname]
        if not c.available() or (c.tiktoken_style and tk is None):
            continue
        try:
            h = c.load(path, tk)
        except Exception as e:  # noqa: BLE001
            print(f"{c.name:11s} cannot load {name}: {str(e)[:80]}")
            continue
        during, dt = counter_rate(lambda: c.encode_native(h, big))  # fresh: no cache yet
        c0 = cpu_s()
        h = c.load(path, tk)
        load = cpu_s() - c0
        rates = []
        for _ in range(2):
            c0 = cpu_s()
            n = sum(c.count(c.encode_native(h, b)) for b in batches)
            rates.append(n / (cpu_s() - c0))
        frac = during / alone
        print(f"{c.name:11s} {name:12s} load {load:.2f} CPU-s; tokens/CPU-s fresh {rates[0]:.3g}, "
              f"warm {rates[1]:.3g}; counter during a {dt:.2f} s call {frac:.2f} of alone "
              f"({'releases' if frac > 0.3 else 'holds'} the GIL)", flush=True)
        for fig, v, unit in (("load CPU-seconds", load, "s"), ("tokens per CPU-second, fresh", rates[0], "tokens/CPU-s"),
                             ("tokens per CPU-second, warm", rates[1], "tokens/CPU-s"),
                             ("Python counter during a call / alone", frac, "x")):
            records.append({"figure": fig, "value": v, "unit": unit, "library": c.name, "file": name,
                            "command": command, "machine": machine, "date": date})
    out = os.path.join(tp.RESULTS, "tokenizer_gil.json")
    with open(out, "w") as f:
        json.dump({"records": records}, f, indent=1)
    print("wrote", os.path.relpath(out, tp.ROOT))


if __name__ == "__main__":
    main()
