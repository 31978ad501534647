"""Heap per raw-text source in one process, as a Ray source loader actor tokenizes.

N sources of bench/ray/ray_text_memory.py (jsonl of the demo corpus, each with its own copy of
data/tokenizer.json), opened from worker threads, then every document's length asked in
batches of --batch documents, round-robin over the sources, from --threads threads (an
actor serves two calls at once): anonymous PSS per source after opening and after
tokenizing (after one malloc_trim), the no-source process subtracted.  No .pllen length
cache (removed first), so every length is tokenized.

    .venv/bin/python bench/text/text_tokenizer_heap.py [--sources 8] [--threads 2] [--batch 16]
        [--pool N] [--lock] [--parallelism]

--pool N: polyload._core.set_tokenize_threads(N) (what the actors set); --lock: one
lengths call at a time; --parallelism: leave tokenizers' own thread pool on
(TOKENIZERS_PARALLELISM unset).  Run with MALLOC_ARENA_MAX=1 to bound glibc's arenas.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import queue
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))


def pss_anon_mib() -> float:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss_Anon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no Pss_Anon in smaps_rollup")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sources", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--pool", type=int, default=0)
    ap.add_argument("--lock", action="store_true")
    ap.add_argument("--parallelism", action="store_true")
    a = ap.parse_args()
    if not a.parallelism:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    sys.path[:0] = [os.path.join(os.path.dirname(HERE), "ray"), os.path.dirname(HERE)]
    import ray_text_memory as rtm  # noqa: PLC0415

    import polyload  # noqa: PLC0415
    from polyload import _core  # noqa: PLC0415

    rtm.make_files()
    for p in glob.glob(os.path.join(rtm.FILES, "*.pllen")):
        os.remove(p)
    libc = ctypes.CDLL("libc.so.6")
    if a.pool:
        _core.set_tokenize_threads(a.pool)
    cfg = polyload._make_config(rtm.config(a.sources))
    jobs: queue.Queue = queue.Queue()

    def worker():
        while True:
            fn = jobs.get()
            if fn is None:
                return
            fn()
            jobs.task_done()

    ths = [threading.Thread(target=worker) for _ in range(a.threads)]
    for t in ths:
        t.start()
    lock = threading.Lock()

    def call(fn):
        if a.lock:
            with lock:
                fn()
        else:
            fn()

    r0 = pss_anon_mib()
    srcs = [None] * a.sources

    def op(i):
        srcs[i] = cfg.open_source(i)

    for i in range(a.sources):
        jobs.put(lambda i=i: call(lambda: op(i)))
    jobs.join()
    r1 = pss_anon_mib()
    pos = [0] * a.sources
    batches = []
    while any(pos[i] < srcs[i].num_documents for i in range(a.sources)):
        for i in range(a.sources):
            n = srcs[i].num_documents
            if pos[i] < n:
                batches.append((i, list(range(pos[i], min(n, pos[i] + a.batch)))))
                pos[i] = min(n, pos[i] + a.batch)
    for i, idx in batches:
        jobs.put(lambda i=i, idx=idx: call(lambda: srcs[i].lengths(idx)))
    jobs.join()
    r2 = pss_anon_mib()
    libc.malloc_trim(0)
    r3 = pss_anon_mib()
    for _ in ths:
        jobs.put(None)
    for t in ths:
        t.join()
    n = a.sources
    print(json.dumps({**vars(a), "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX"),
                      "open_mib_per_source": round((r1 - r0) / n, 2),
                      "tokenize_mib_per_source": round((r2 - r1) / n, 2),
                      "total_after_trim_mib_per_source": round((r3 - r0) / n, 2)}))


if __name__ == "__main__":
    main()
