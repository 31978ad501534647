#!/usr/bin/env python3
"""Time from process start to the first batch, warm page cache,
with 2,000 Megatron files as ONE source (a directory of prefixes) and as
2,000 SOURCES (weight 1 each).

Data: bench/out/startup/files/f0000..f1999 .bin/.idx, synthetic, 50 documents
each of random lengths 10..1000 tokens (uint16), written with numpy in
megatron-core's MMapIndexedDataset format (version 1).

polyload: wall clock of `build-bench/polyload run CONFIG --steps 1 --json
--no-progress` measured from the parent (fork+exec to exit, so it covers
config parsing, opening every source, planning step 0 and building all 16
micro-batches of step 0 -- more than one batch).  Run twice; the second run
(warm page cache, .idx files already read once) is reported.

peer: megatron-core, a fresh `python` process that imports megatron-core,
builds a BlendedDataset over 2,000 GPTDatasets with
BlendedMegatronDatasetBuilder and takes the first batch from a DataLoader
(num_workers=2, batch_size=2).  One source = blend weights None (Megatron
samples the prefixes in proportion to their sizes); 2,000 sources = weight 1
each.  Run with an empty index cache (Megatron builds and writes its .npy
indices, first launch) and again with the cache in place (later launches).
Each run is capped at --cap seconds (default 600).

Usage: .venv/bin/python bench/embedded/startup.py [--json OUT.json] [--skip-megatron]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
from _common import OUT, ROOT, machine_note, run_cli  # noqa: E402
import results as bench_results  # noqa: E402

N_FILES = 2000
DOCS = 50
DIR = os.path.join(OUT, "startup")
FILES = os.path.join(DIR, "files")
SEQ_LENGTH = 2048
GBS = 32
MBS = 2
TRAIN_STEPS = 100  # Megatron sizes its indices for train_steps * GBS samples


def write_megatron(prefix, lengths, rng):
    import numpy as np
    lengths = np.asarray(lengths, dtype=np.int32)
    tokens = rng.integers(2, 32000, size=int(lengths.sum()), dtype=np.uint16)
    ends = np.cumsum(lengths)
    tokens[ends - 1] = 0  # end-of-document token, as --append-eod
    tokens.tofile(prefix + ".bin")
    pointers = np.zeros(len(lengths), dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * 2)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], dtype=np.uint64).tobytes())
        f.write(np.array([8], dtype=np.uint8).tobytes())
        f.write(np.array([len(lengths)], dtype=np.uint64).tobytes())
        f.write(np.array([len(lengths) + 1], dtype=np.uint64).tobytes())
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(lengths) + 1, dtype=np.int64).tobytes())


def make_files():
    import numpy as np
    stamp = os.path.join(FILES, f".done-{N_FILES}x{DOCS}")
    if os.path.exists(stamp):
        return
    shutil.rmtree(FILES, ignore_errors=True)
    os.makedirs(FILES)
    rng = np.random.default_rng(1234)
    for i in range(N_FILES):
        write_megatron(os.path.join(FILES, f"f{i:04d}"),
                       rng.integers(10, 1001, size=DOCS), rng)
    open(stamp, "w").close()


def prefixes():
    return [os.path.join(FILES, f"f{i:04d}") for i in range(N_FILES)]


def header():
    return (f"seed: 1234\nseq_length: {SEQ_LENGTH}\nglobal_batch_size: {GBS}\n"
            f"micro_batch_size: {MBS}\ntrain_steps: {TRAIN_STEPS}\ndtype: int64\n"
            "pad_id: 1\nlong_documents: split\npacking: best_fit\nbalance: greedy\n"
            "cost: {preset: llama-1b}\non_error: fail\n"
            "topology: {dp: 4, pp: 1, cp: 1, tp: 1}\nthreads: 2\nprefetch: 4\nsources:\n")


def write_configs():
    one = os.path.join(DIR, "one_source.yaml")
    with open(one, "w") as f:
        f.write(header())
        f.write(f"  - {{name: all, type: megatron, path: {os.path.relpath(FILES, ROOT)}, "
                "weight: 1}\n")
    many = os.path.join(DIR, "many_sources.yaml")
    with open(many, "w") as f:
        f.write(header())
        for i, p in enumerate(prefixes()):
            f.write(f"  - {{name: s{i:04d}, type: megatron, path: {os.path.relpath(p, ROOT)}, "
                    "weight: 1}\n")
    single = os.path.join(DIR, "single_file.yaml")  # baseline for bench/embedded/memory.c
    with open(single, "w") as f:
        f.write(header())
        f.write(f"  - {{name: s0000, type: megatron, path: {os.path.relpath(prefixes()[0], ROOT)}, "
                "weight: 1}\n")
    return os.path.relpath(one, ROOT), os.path.relpath(many, ROOT)


def bench_polyload(cfg):
    runs = []
    for _ in range(2):
        out, wall, cpu = run_cli(["run", cfg, "--steps", "1", "--json", "--no-progress"])
        runs.append({"wall_s": wall, "cpu_s": cpu, "tokens": out["tokens"],
                     "cli_seconds": out["seconds"]})
    return {"command": f"build-bench/polyload run {cfg} --steps 1 --json --no-progress",
            "runs": runs, "first_batch_s": runs[-1]["wall_s"]}


PEER = r"""
import os, sys, time, json, warnings, logging
t_start = float(sys.argv[1])
warnings.filterwarnings("ignore")
sys.path.insert(0, %(bench)r)
import torch
from _common import EodTokenizer, init_torch_distributed, megatron_quiet
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
megatron_quiet()
init_torch_distributed()
prefixes = %(prefixes)r
weights = %(weights)r
cfg = GPTDatasetConfig(random_seed=1234, sequence_length=%(seq)d,
    blend=(prefixes, weights), split="100,0,0", path_to_cache=%(cache)r,
    tokenizer=EodTokenizer(), reset_position_ids=False, reset_attention_mask=False,
    eod_mask_loss=False, create_attention_mask=False)
t_import = time.time() - t_start
train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [%(size)d, 0, 0], lambda: True, cfg).build()
t_built = time.time() - t_start
loader = torch.utils.data.DataLoader(train, batch_size=%(mbs)d, num_workers=2)
b = next(iter(loader))
t_first = time.time() - t_start
print(json.dumps({"import_s": t_import, "built_s": t_built, "first_batch_s": t_first,
                  "tokens": int(b["tokens"].numel())}))
sys.stdout.flush()
os._exit(0)
"""


POLYLOAD_PY = r"""
import sys, time, json
t_start = float(sys.argv[1])
import torch
import polyload
t_import = time.time() - t_start
loader = polyload.Loader(%(cfg)r, rank=0, ranks=range(4))
t_built = time.time() - t_start
b = loader.next_batch(0)
t_first = time.time() - t_start
print(json.dumps({"import_s": t_import, "built_s": t_built, "first_batch_s": t_first,
                  "tokens": int(b["input_ids"].numel())}))
sys.stdout.flush()
loader.close()
"""


def bench_polyload_python(kind, cfg, cap):
    """A fresh python process: import torch and polyload, Loader(cfg), first batch."""
    script = os.path.join(DIR, f"polyload_{kind}.py")
    with open(script, "w") as f:
        f.write(POLYLOAD_PY % {"cfg": os.path.join(ROOT, cfg)})
    res = {"command": f".venv/bin/python {os.path.relpath(script, ROOT)} <start time>",
           "runs": []}
    for _ in range(2):  # the second run is the warm-cache figure, as for the CLI
        t0 = time.time()
        p = subprocess.run([sys.executable, script, repr(t0)], cwd=ROOT,
                           capture_output=True, text=True, timeout=cap)
        wall = time.time() - t0
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-4000:])
            res["runs"].append({"first_batch_s": None, "note": f"exit {p.returncode}"})
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r["process_wall_s"] = wall
        res["runs"].append(r)
    res["first_batch_s"] = res["runs"][-1].get("first_batch_s")
    res["process_wall_s"] = res["runs"][-1].get("process_wall_s")
    return res


def bench_megatron(kind, cap):
    cache = os.path.join(DIR, f"megatron_cache_{kind}")
    shutil.rmtree(cache, ignore_errors=True)
    script = os.path.join(DIR, f"megatron_{kind}.py")
    with open(script, "w") as f:
        f.write(PEER % {
            "bench": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            "prefixes": prefixes(),
            "weights": None if kind == "one_source" else [1.0] * N_FILES,
            "seq": SEQ_LENGTH, "cache": cache, "size": TRAIN_STEPS * GBS, "mbs": MBS})
    res = {"command": f".venv/bin/python {os.path.relpath(script, ROOT)} <start time>"}
    for label in ("empty_cache", "with_cache"):
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, script, repr(t0)], cwd=ROOT,
                               capture_output=True, text=True, timeout=cap)
        except subprocess.TimeoutExpired:
            res[label] = {"first_batch_s": None, "note": f"> {cap} s"}
            continue
        wall = time.time() - t0
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-4000:])
            res[label] = {"first_batch_s": None, "note": f"exit {p.returncode}"}
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r["process_wall_s"] = wall
        res[label] = r
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cap", type=int, default=600)
    ap.add_argument("--skip-megatron", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    os.chdir(ROOT)
    t0 = time.time()
    make_files()
    print(f"files ready in {time.time() - t0:.1f} s", flush=True)
    one, many = write_configs()
    res = {"machine": machine_note(), "files": N_FILES, "docs_per_file": DOCS}
    for kind, cfg in (("one_source", one), ("many_sources", many)):
        res[kind] = {"polyload": bench_polyload(cfg),
                     "polyload_python": bench_polyload_python(kind, cfg, a.cap)}
        print(kind, json.dumps(res[kind]["polyload"]), flush=True)
        print(kind, json.dumps(res[kind]["polyload_python"]), flush=True)
    if not a.skip_megatron:
        for kind in ("one_source", "many_sources"):
            res[kind]["megatron"] = bench_megatron(kind, a.cap)
            print(kind, json.dumps(res[kind]["megatron"]), flush=True)
    print("\nsummary (seconds from process start to first batch, warm page cache):")
    for kind in ("one_source", "many_sources"):
        p = res[kind]["polyload"]["first_batch_s"]
        py = res[kind]["polyload_python"]["first_batch_s"]
        line = f"  {kind:13s} polyload CLI {p:.3f} s; python+torch+polyload.Loader {py:.3f} s"
        m = res[kind].get("megatron")
        if m:
            for label in ("empty_cache", "with_cache"):
                v = m[label].get("first_batch_s")
                line += (f"; megatron ({label}) {v:.2f} s = {v / py:.1f}x the Python process"
                         if v else f"; megatron ({label}) {m[label]['note']}")
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    figures = []
    for kind, what in (("one_source", "2,000 files as 1 source"),
                       ("many_sources", "2,000 sources")):
        m = (res[kind].get("megatron") or {}).get("with_cache", {}).get("first_batch_s")
        peer = {"peer": "megatron-core process, index cache present", "peer_value": m} if m else {}
        figures.append(bench_results.record(
            f"C CLI, start to first batch, {what}", res[kind]["polyload"]["first_batch_s"],
            "s", lower_is_better=True, **peer))
        py = res[kind]["polyload_python"]["first_batch_s"]
        if py is not None:
            figures.append(bench_results.record(
                f"Python process to first batch, imports included, {what}", py, "s",
                lower_is_better=True, headline=True if kind == "one_source" else None,
                **peer))
    print(bench_results.write("embedded_startup", figures))


if __name__ == "__main__":
    main()
