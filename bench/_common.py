"""Shared helpers for the polyload benchmarks (bench/*.py).

Everything here is stdlib + what the project venv has (torch, megatron-core,
numpy).  Paths are relative to the repository root, which every benchmark
makes its working directory.
"""
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
CLI = os.environ.get("POLYLOAD_CLI", os.path.join(ROOT, "build-bench", "polyload"))


def machine_note():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) // (1024 * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "mem_gib": mem,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }


def run_cli(args, timeout=600):
    """Run the polyload CLI; return (parsed JSON, wall seconds, cpu seconds)."""
    t0 = time.perf_counter()
    before = os.times()
    p = subprocess.run([CLI] + args, cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    wall = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + \
          (after.children_system - before.children_system)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise RuntimeError(f"polyload {' '.join(args)} exited {p.returncode}")
    return json.loads(p.stdout), wall, cpu


def proc_cpu_seconds(pid):
    """user+system CPU seconds of a live process (from /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class EodTokenizer:
    """The minimum megatron-core's GPTDataset asks of a tokenizer: ids of the
    end-of-document and padding tokens and the vocabulary size.  Values are
    those of data/tokenizer.json (<|endoftext|> = 0, <pad> = 1, 32000 ids)."""

    def __init__(self, eod=0, pad=1, vocab_size=32000):
        self.eod = eod
        self.eos = eod
        self.pad = pad
        self.vocab_size = vocab_size
        # megatron-core hashes this into its cache file names
        self.unique_identifiers = {"class": "EodTokenizer", "eod": eod, "pad": pad,
                                   "vocab_size": vocab_size}


def init_torch_distributed():
    """megatron-core calls torch.distributed.get_rank() when it writes its
    index cache; a one-process gloo group satisfies it."""
    import torch.distributed as dist
    if not dist.is_initialized():
        path = os.path.join(OUT, f"dist-init-{os.getpid()}")
        os.makedirs(OUT, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        dist.init_process_group("gloo", init_method=f"file://{path}",
                                rank=0, world_size=1)


def megatron_quiet():
    import logging
    import warnings
    logging.getLogger("megatron").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
