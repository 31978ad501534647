"""Shared parts of the peer harnesses (bench/peers/*.py): the corpus, the PyTorch loop and
the checks.  Only stdlib, numpy and torch, so that it imports in every peer's venv.

The work is the same for every loader:

- the four sources of examples/pretrain_mix.yaml (data/*_text_document.{bin,idx}, built by
  ``make corpus``), constant token weights 0.4/0.3/0.2/0.1 (the demo's step-0 weights);
- peers get each source as its token stream (documents in file order, each ending with
  EOD 0) cut into consecutive, non-overlapping samples of ``seq_length + 1`` tokens, i.e.
  **concatenated** (no padding, attention across document boundaries), input_ids = x[:-1],
  labels = x[1:]; every sample comes from one source, so a sample weight is a token weight;
- polyload gets the same .bin/.idx files (its own format is Megatron's) and **packs**
  documents (best_fit, per-document position_ids and cu_seqlens);
- micro-batches of 2 sequences; a "step" is 32 sequences (global_batch_size of the demo):
  16 micro-batches in a row;
- the loop (``drive``) touches input_ids and labels (and polyload's loss_mask and
  position_ids) of every micro-batch and counts non-padding tokens.

Every harness is run as ``VENV/bin/python bench/peers/NAME.py MODE [--seq N] ...`` and
prints one JSON line (see ``main``).  A sample is identified by ``sid`` = source * 10**7 +
index of the sample in its source, recovered from the delivered tokens by hashing the row
(polyload: each document piece, located by cu_seqlens), so that the checks look only at
what reached the loop; megatron-core's samples span documents, so its mixture check takes
the source from its BlendedDataset index (peer_megatron.py).
"""
import argparse
import hashlib
import json
import os
import re
import struct
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "bench", "out", "peers")
EXAMPLE = os.path.join(ROOT, "examples", "pretrain_mix.yaml")
MICRO_BATCH = 2
GLOBAL_BATCH = 32
MB_PER_STEP = GLOBAL_BATCH // MICRO_BATCH
PAD_ID = 1
SEED = 1234
SID_BASE = 10 ** 7


def sources():
    """[(name, prefix, weight)] of examples/pretrain_mix.yaml's ``sources:`` (step-0
    weights), parsed with a regex so that the peer venvs need no YAML package."""
    with open(EXAMPLE) as f:
        text = f.read().split("\nschedule:", 1)[0]
    rows = re.findall(r"\{name: (\w+), *type: megatron, *path: ([\w/]+), *weight: ([\d.]+)\}",
                      text)
    assert len(rows) == 4, rows
    return [(n, p, float(w)) for n, p, w in rows]


SOURCES = sources()
NAMES = [n for n, _, _ in SOURCES]
WEIGHTS = [w for _, _, w in SOURCES]
REWEIGHTS = [0.1, 0.2, 0.3, 0.4]  # the weights after a resume in the weight-change check


# ----------------------------------------------------------------------------- corpus

def read_megatron(prefix):
    """(tokens, document lengths) of a Megatron MMIDIDX v1 pair, tokens memory-mapped."""
    with open(os.path.join(ROOT, prefix + ".idx"), "rb") as f:
        head = f.read(9 + 8 + 1 + 8 + 8)
        assert head[:9] == b"MMIDIDX\x00\x00", prefix
        code = head[17]
        n_seq, = struct.unpack("<Q", head[18:26])
        lengths = np.frombuffer(f.read(4 * n_seq), dtype=np.int32)
    dtype = {4: np.int32, 8: np.uint16}[code] if code in (4, 8) else None
    assert dtype is not None, f"{prefix}.idx dtype code {code}"
    tokens = np.memmap(os.path.join(ROOT, prefix + ".bin"), dtype=dtype, mode="r")
    assert tokens.size == int(lengths.astype(np.int64).sum()), prefix
    return tokens, lengths


def source_samples(i, seq):
    """uint16 [n, seq+1]: source i's token stream cut into consecutive samples."""
    tokens, _ = read_megatron(SOURCES[i][1])
    n = tokens.size // (seq + 1)
    return np.asarray(tokens[: n * (seq + 1)], dtype=np.uint16).reshape(n, seq + 1)


def all_samples(seq):
    return [source_samples(i, seq) for i in range(len(SOURCES))]


def row_key(row):
    """Hash of one input_ids row (any integer dtype; values compared as int64)."""
    return hashlib.blake2b(np.ascontiguousarray(row, dtype=np.int64).tobytes(),
                           digest_size=12).digest()


class SampleIndex:
    """input_ids row -> sid, over every sample of every source at one seq_length."""

    def __init__(self, seq):
        from collections import Counter

        self.map = {}
        self.expected = [Counter() for _ in SOURCES]  # sid -> deliveries per epoch
        for i, s in enumerate(all_samples(seq)):
            for j in range(s.shape[0]):
                sid = self.map.setdefault(row_key(s[j, :-1]), i * SID_BASE + j)
                self.expected[sid // SID_BASE][sid] += 1

    def ids(self, batch):
        """[(sid, tokens)] of a micro-batch's rows (sid -1: not a sample of the corpus)."""
        rows = np.asarray(batch["input_ids"])
        return [(self.map.get(row_key(r), -1), rows.shape[1]) for r in rows]


def batch_key(b):
    """Hash of a whole micro-batch (input_ids and labels), for equality checks."""
    h = hashlib.blake2b(digest_size=16)
    for name in ("input_ids", "labels"):
        if name in b:
            h.update(np.ascontiguousarray(np.asarray(b[name]), dtype=np.int64).tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------ loop

def cpu_seconds_tree(pid=None):
    """user+system CPU seconds of this process and all its live descendants, plus the
    children it already reaped."""
    pid = os.getpid() if pid is None else pid
    ticks = os.sysconf("SC_CLK_TCK")
    kids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append((int(p), fields))
    total = 0.0
    stack = [pid]
    seen = set()
    with open(f"/proc/{pid}/stat") as f:
        own = f.read().rsplit(")", 1)[1].split()
    total += (int(own[11]) + int(own[12]) + int(own[13]) + int(own[14])) / ticks
    while stack:
        q = stack.pop()
        for c, fields in kids.get(q, []):
            if c in seen:
                continue
            seen.add(c)
            # its own time and that of its children it reaped (Ray's raylet reaps workers)
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) +
                      int(fields[14])) / ticks
            stack.append(c)
    return total


def descendants(pid=None):
    """Pids of all live descendants of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(p))
    out, stack = [], [pid]
    while stack:
        for c in kids.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def kill_descendants():
    """SIGKILL this process's worker processes (and theirs): the start-up mode exits right
    after its first batch, and workers left behind would hold the caller's stdout open."""
    import signal

    for p in descendants():
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def drive(batches, warmup, seconds, pad_id=PAD_ID, max_batches=None):
    """The PyTorch loop: consume micro-batch dicts of torch tensors; after ``warmup``
    micro-batches, time until ``seconds`` have passed (or ``max_batches``).

    Returns non-padding tokens/s, CPU-s per million non-padding tokens (this process and
    its children: the loader's workers), padding fraction, micro-batches timed."""
    import torch

    touched = torch.zeros((), dtype=torch.float64)
    it = iter(batches)
    for _ in range(warmup):
        b = next(it)
        touched += b["input_ids"].sum()
    tokens = padding = n = 0
    cpu0 = cpu_seconds_tree()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        try:
            b = next(it)
        except StopIteration:  # a loader that ends its window at an epoch end (Ray Data)
            break
        ids = b["input_ids"]
        real = int((ids != pad_id).sum())
        tokens += real
        padding += ids.numel() - real
        touched += ids.sum() + b["labels"].sum()
        if "loss_mask" in b:
            touched += b["loss_mask"].sum() + b["position_ids"].sum()
        n += 1
        if (n & 7) == 0 and time.perf_counter() >= deadline:
            break
        if max_batches and n >= max_batches:
            break
    dt = time.perf_counter() - t0
    cpu = cpu_seconds_tree() - cpu0
    return {"tokens_per_s": tokens / dt, "cpu_s_per_mtok": cpu / tokens * 1e6,
            "padding_fraction": padding / (tokens + padding), "micro_batches": n,
            "seconds": dt, "tokens": tokens, "checksum": float(touched)}


def take(it, n):
    out = []
    for _ in range(n):
        out.append(next(it))
    return out


# ----------------------------------------------------------------------------- checks

def mixture_error(step_source_tokens, weights):
    """Max over steps and sources of |realized - scheduled| tokens, per step (tokens of
    source s in the step minus w_s times the step's tokens) and cumulative (at step
    boundaries, from the start)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    per = np.asarray(step_source_tokens, dtype=np.float64)
    tot = per.sum(axis=1, keepdims=True)
    step_err = np.abs(per - tot * w).max()
    cum = np.cumsum(per, axis=0)
    cum_err = np.abs(cum - cum.sum(axis=1, keepdims=True) * w).max()
    return {"per_step_max": float(step_err), "cumulative_max": float(cum_err),
            "steps": int(per.shape[0]), "tokens_per_step": float(tot.mean()),
            "realized_fraction": (cum[-1] / cum[-1].sum()).tolist()}


def step_tokens(batches, index, n_steps):
    """[[delivered tokens of each source] per step] from micro-batches (16 per step)."""
    rows = []
    unknown = 0
    for s in range(n_steps):
        counts = [0] * len(SOURCES)
        for b in batches[s * MB_PER_STEP:(s + 1) * MB_PER_STEP]:
            for sid, ntok in index.ids(b):
                if sid < 0:
                    unknown += 1
                    continue
                counts[sid // SID_BASE] += ntok
        rows.append(counts)
    return rows, unknown


def equal_runs(a, b):
    """Compare two lists of batch keys: {"equal": bool, "first_difference": i or None}."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return {"equal": False, "first_difference": i, "compared": min(len(a), len(b))}
    return {"equal": len(a) == len(b), "first_difference": None, "compared": min(len(a), len(b))}






# ------------------------------------------------------------------------- PSS column
# "PSS of all processes with 8 ranks, and per added source (30 vs 300 sources)": every
# loader feeds 8 ranks from N sources (N = 30 and 300) of the same small data: source i
# holds PSS_PER_SOURCE samples of the demo corpus (samples i*K..(i+1)*K-1 of the four
# sources' samples at seq_length 2048, concatenated), equal weights.  Each rank takes
# PSS_TAKE micro-batches; then the runner (run_table.py, part "pss") sums PSS
# (/proc/PID/smaps_rollup) over every process of the ranks' trees (DataLoader workers,
# Grain's worker processes, Ray's daemons and workers).

PSS_SEQ = 2048
PSS_PER_SOURCE = 16
PSS_TAKE = 8
PSS_RANKS = 8
PSS_MAX_SOURCES = 300  # a writer that writes all sources at once writes this many


def pss_dir(name):
    return os.path.join(OUT, "pss", name)


def pss_samples(n):
    """uint16 [n, PSS_PER_SOURCE, PSS_SEQ + 1]: the samples of n sources."""
    alls = np.concatenate(all_samples(PSS_SEQ))
    need = n * PSS_PER_SOURCE
    assert need <= alls.shape[0], (n, alls.shape)
    return np.ascontiguousarray(alls[:need]).reshape(n, PSS_PER_SOURCE, PSS_SEQ + 1)


def pss_docs(n):
    """[[uint16 document]] per source, for the Megatron-format loaders: each source's
    token stream (its samples back to back: consecutive corpus text) cut after every
    EOD (0), so documents are the corpus's (the first and last ones cut)."""
    out = []
    for s in pss_samples(n):
        stream = s.reshape(-1)
        docs = [d for d in np.split(stream, np.flatnonzero(stream == 0) + 1) if d.size]
        out.append(docs)
    return out


def pss_rank(peer, n, rank, world, ready):
    """One rank (or, rank -1, all ranks) of the PSS column: the peer's loader over n
    sources, PSS_TAKE micro-batches touched, the ready file written, then idle until the
    runner measures and ends it (SIGTERM: the peer's ``pss_close`` first, e.g. Ray's
    shutdown)."""
    import signal

    its = peer.pss_loader(n, rank, world) if rank >= 0 else None

    def stop(*_):
        try:
            getattr(peer, "pss_close", lambda _its: None)(its)
        finally:
            os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    if rank < 0:  # the peer runs the ranks itself (Ray Data: one actor per rank)
        its, touched = peer.pss_all(n, world)
    else:
        touched = 0
        for _ in range(PSS_TAKE):
            b = next(its)
            touched += int(b["input_ids"].sum()) + int(b["labels"].sum())
    with open(ready, "w") as f:
        json.dump({"pid": os.getpid(), "checksum": touched}, f)
    while True:
        time.sleep(1)


def children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def process_tree(roots):
    """The pids of ``roots`` and all their live descendants."""
    kids, out, todo = children_map(), [], list(roots)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def pss_own_kib(pid):
    """PSS (KiB) of a process less the pages of programs and shared libraries: anonymous
    memory, shared memory and the mappings of files under bench/out/ (the data).  A
    library's PSS is split with every process of the machine mapping it, other
    sessions' included, so it moves with what else runs; the rest is the loader's."""
    own, keep = 0, False
    out_dir = os.path.join(ROOT, "bench", "out") + os.sep
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(" ", 1)[0]
            if "-" in first and not first.endswith(":"):
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) > 5 else ""
                keep = (not path.startswith("/") or path.startswith("/dev/shm")
                        or path.startswith(out_dir))
            elif first == "Pss:" and keep:
                own += int(line.split()[1])
    return own


def pss_sum(pids):
    """{"processes", "pss_mib", "pss_anon_mib", "pss_file_mib", "pss_shmem_mib",
    "pss_own_mib", "by_command_mib"} summed over ``pids`` (/proc/PID/smaps_rollup;
    ``pss_own``: pss_own_kib)."""
    tot = {"Pss": 0, "Pss_Anon": 0, "Pss_File": 0, "Pss_Shmem": 0, "Pss_Own": 0}
    by = {}
    n = 0
    for p in pids:
        row = dict.fromkeys(tot, 0)
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    k = line.split(":")[0]
                    if k in row:
                        row[k] = int(line.split()[1])
            with open(f"/proc/{p}/comm") as f:
                comm = f.read().strip()
            row["Pss_Own"] = pss_own_kib(p)
        except OSError:
            continue
        n += 1
        for k in tot:
            tot[k] += row[k]
        by[comm] = by.get(comm, 0) + row["Pss"]
    return {"processes": n, "pss_mib": tot["Pss"] / 1024, "pss_anon_mib": tot["Pss_Anon"] / 1024,
            "pss_file_mib": tot["Pss_File"] / 1024, "pss_shmem_mib": tot["Pss_Shmem"] / 1024,
            "pss_own_mib": tot["Pss_Own"] / 1024,
            "by_command_mib": {c: round(v / 1024, 1)
                               for c, v in sorted(by.items(), key=lambda x: -x[1])}}


# ---------------------------------------------------------------------------- driver

def main(peer):
    """Command line of a peer harness.  ``peer`` is a module-like object with:

    - ``prepare(seq)``: write the peer's data for this seq_length in its own format (once);
    - ``loader(seq, weights=WEIGHTS, files=None)``: an iterator of micro-batch dicts;
    - optional ``state(it)`` / ``resume(seq, state, weights=WEIGHTS)`` for the resume checks
      (``state`` must return something picklable; it is pickled and unpickled);
    - optional ``dp_resume(seq)``: a dict for the resume-with-another-DP-size column;
    - optional ``close(it)``.
    Modes print one JSON line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["prepare", "throughput", "startup", "mixture", "resume",
                                     "reweight", "dpresume", "pssprep", "pssrank", "dprank"])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--k", type=int, default=120, help="micro-batches before the resume")
    ap.add_argument("--n", type=int, default=100, help="micro-batches compared after it")
    ap.add_argument("--files", default="4", help="startup: '1' or '2000'")
    ap.add_argument("--t0", type=float, default=None, help="startup: spawn time (time.time)")
    ap.add_argument("--sources", type=int, default=300, help="pssprep / pssrank: sources")
    ap.add_argument("--rank", type=int, default=0, help="pssrank: this process's rank "
                    "(-1: all ranks in this process, for a peer that runs them itself)")
    ap.add_argument("--world", type=int, default=PSS_RANKS, help="pssrank: ranks")
    ap.add_argument("--ready", default=None, help="pssrank: file written once ready")
    ap.add_argument("--phase", choices=["save", "load"], help="dprank: save or load a state")
    ap.add_argument("--dir", help="dprank: directory of the states and sample lists")
    ap.add_argument("--from-world", type=int, default=2, help="dprank: the saved run's dp")
    a = ap.parse_args()
    if a.mode == "dprank":
        dp_rank(peer, a.seq, a.phase, a.rank, a.world, a.from_world, a.k, a.n, a.dir)
        return
    if a.mode == "pssprep":
        t = time.perf_counter()
        peer.pss_prepare(a.sources)
        print(json.dumps({"peer": peer.NAME, "mode": a.mode, "sources": a.sources,
                          "seconds": time.perf_counter() - t}), flush=True)
        return
    if a.mode == "pssrank":
        pss_rank(peer, a.sources, a.rank, a.world, a.ready)
        return
    res = {"peer": peer.NAME, "mode": a.mode, "seq": a.seq}
    if a.mode == "prepare":
        t = time.perf_counter()
        peer.prepare(a.seq)
        res["seconds"] = time.perf_counter() - t
    elif a.mode == "startup":
        it = iter(peer.loader(a.seq, files=a.files))
        next(it)
        res["first_batch_s"] = time.time() - a.t0 if a.t0 else None
        print(json.dumps(res), flush=True)
        kill_descendants()  # shutdown of workers is not part of the figure
        os._exit(0)
    elif a.mode == "throughput":
        it = peer.loader(a.seq)
        if hasattr(it, "stop_at_epoch_end"):
            it.stop_at_epoch_end = True
        res.update(drive(it, a.warmup, a.seconds))
        print(json.dumps(res), flush=True)  # before closing: Ray's shutdown can abort
        getattr(peer, "close", lambda it: None)(it)
        return
    elif a.mode == "mixture":
        it = iter(peer.loader(a.seq))
        index = make_index(peer, a.seq)
        rows, unknown = step_tokens(take(it, a.steps * MB_PER_STEP), index, a.steps)
        res.update(mixture_error(rows, WEIGHTS))
        res["unidentified_samples"] = unknown
        print(json.dumps(res), flush=True)
        getattr(peer, "close", lambda it: None)(it)
        return
    elif a.mode in ("resume", "reweight"):
        res.update(resume_check(peer, a.seq, a.k, a.n, a.mode == "reweight"))
    elif a.mode == "dpresume":
        if hasattr(peer, "dp_resume"):
            res.update(peer.dp_resume(a.seq, a.k, a.n))
        elif hasattr(peer, "loader_env"):
            res.update(dp_change_multiproc(peer, a.seq, a.k, a.n))
        elif hasattr(peer, "loader_dp"):
            res.update(dp_change_check(peer, a.seq, a.k, a.n))
        elif hasattr(peer, "NO_DP"):
            res.update(result=peer.NO_DP.split(":")[0], what_happened=peer.NO_DP)
        else:
            res["result"] = "not measured"
    print(json.dumps(res), flush=True)


def make_index(peer, seq):
    return peer.make_index(seq) if hasattr(peer, "make_index") else SampleIndex(seq)


def resume_check(peer, seq, k, n, reweight, cap=2400):
    """Exact resume (``reweight`` False): K micro-batches, state, a new loader from the
    (pickled) state, N micro-batches == micro-batches K..K+N of the uninterrupted run.

    Weight change (``reweight`` True): the same, but the new loader gets REWEIGHTS (fortunes
    0.1 -> 0.4) and runs until fortunes, the smallest source, has delivered one epoch's worth
    of samples counting those before the resume (at most ``cap`` micro-batches).  Nothing
    lost and nothing repeated means: those first deliveries are exactly fortunes' samples,
    each once, and no sample of another source was delivered twice."""
    import pickle

    if not hasattr(peer, "state"):
        return {"result": "no", "what_happened": peer.NO_STATE}
    it = iter(peer.loader(seq))
    before = take(it, k)
    try:
        st = pickle.loads(pickle.dumps(peer.state(it)))
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {"result": "no", "what_happened": f"state failed: {type(e).__name__}: {e}"[:300]}
    ref = take(it, n) if not reweight else None
    getattr(peer, "close", lambda it: None)(it)
    index = make_index(peer, seq) if reweight else None
    try:
        it2 = iter(peer.resume(seq, st, weights=REWEIGHTS if reweight else WEIGHTS))
        if not reweight:
            after = take(it2, n)
        else:
            after_ids, mbs = epoch_after(it2, index, before, cap)
        getattr(peer, "close", lambda it: None)(it2)
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {"result": "no", "what_happened": f"resume failed: {type(e).__name__}: {e}"[:300]}
    if not reweight:
        cmp = equal_runs([batch_key(b) for b in ref], [batch_key(b) for b in after])
        cmp["result"] = "yes" if cmp["equal"] else "no"
        if not cmp["equal"]:
            rows = lambda bs: [row_key(r) for b in bs for r in np.asarray(b["input_ids"])]  # noqa: E731
            x, y = rows(ref), rows(after)
            common_rows = sum(min(v, y.count(k)) for k, v in
                              {k: x.count(k) for k in set(x)}.items())
            cmp["same_samples_any_order"] = common_rows
            cmp["what_happened"] = (
                f"micro-batch {cmp['first_difference']} of {n} after the resume differs from "
                f"the uninterrupted run; {common_rows} of {len(x)} sequences of those {n} "
                "micro-batches are among the resumed run's")
        return cmp
    before_ids = [x for b in before for x in index.ids(b)]
    last = [x for ids in after_ids[-2 * MB_PER_STEP:] for x in ids]
    r = epoch_check(index, before_ids, [x for ids in after_ids for x in ids], last)
    r["micro_batches_after"] = mbs
    # control: the same check on an uninterrupted run with the new weights from the start
    it3 = iter(peer.loader(seq, weights=REWEIGHTS))
    ctl, _ = epoch_after(it3, index, [], cap)
    getattr(peer, "close", lambda it: None)(it3)
    c = epoch_check(index, [], [x for ids in ctl for x in ids],
                    [x for ids in ctl[-2 * MB_PER_STEP:] for x in ids])
    r["control_without_resume"] = {k: c[k] for k in ("result", "what_happened")}
    if r["result"] == "no" and c["result"] == "no":
        r["what_happened"] += "; without a resume too: " + c["what_happened"]
    return r


def epoch_after(it, index, before, cap):
    """[(sid, tokens)] of each micro-batch delivered after the resume until the end of the
    step after the one in which the smallest source's epoch is covered (or ``cap``
    micro-batches), and the number of micro-batches."""
    small = len(SOURCES) - 1
    need = sum(index.expected[small].values())
    have = sum(1 for b in before for s, _ in index.ids(b) if s >= 0 and s // SID_BASE == small)
    out = []
    mbs = 0
    while mbs < cap and (have < need or (len(before) + mbs) % MB_PER_STEP):
        ids = index.ids(next(it))
        mbs += 1
        out.append(ids)
        have += sum(1 for s, _ in ids if s >= 0 and s // SID_BASE == small)
    for _ in range(MB_PER_STEP if mbs < cap else 0):  # one more step: carried-over chunks
        ids = index.ids(next(it))
        mbs += 1
        out.append(ids)
        have += sum(1 for s, _ in ids if s >= 0 and s // SID_BASE == small)
    return out, mbs


def epoch_check(index, before_ids, after_ids, last_step_ids=()):
    """Loss and repetition over a weight-changing resume, from (sid, tokens) lists.

    The smallest source must have delivered every one of its samples by the end of the
    step after the one that completes its epoch (none missing), with no repeat in its
    deliveries before those two steps (the epoch boundary may fall inside a step, and a
    packer may carry a chunk to the next step, so the next epoch's first samples can come
    before the last ones of this epoch); the other sources are in their first epoch, so
    any repeat there is a repetition."""
    from collections import Counter

    small = len(SOURCES) - 1
    exp = index.expected[small]
    need = sum(exp.values())
    is_small = lambda s: s >= 0 and s // SID_BASE == small  # noqa: E731
    seq_small = [s for s, _ in before_ids + after_ids if is_small(s)]
    tail = sum(1 for s, _ in last_step_ids if is_small(s))
    missing = sum((exp - Counter(seq_small)).values())
    head = Counter(seq_small[:max(0, len(seq_small) - tail)])
    extra = sum((head - exp).values())
    r = {"small_source": NAMES[small], "epoch_samples": need, "delivered": len(seq_small),
         "missing_in_epoch": missing, "repeated_in_epoch": extra}
    rep = 0
    for src in range(len(SOURCES) - 1):
        c = Counter(s for s, _ in before_ids + after_ids if s >= 0 and s // SID_BASE == src)
        rep += sum(max(0, v - index.expected[src].get(s, 0)) for s, v in c.items())
    r["repeated_other_sources"] = rep
    tok = [0] * len(SOURCES)
    for s, t in after_ids:
        if s >= 0:
            tok[s // SID_BASE] += t
    tot = max(1, sum(tok))
    r["after_fraction"] = [t / tot for t in tok]
    r["new_weights"] = REWEIGHTS
    covered = len(seq_small) >= need
    follows = max(abs(f - w) for f, w in zip(r["after_fraction"], REWEIGHTS)) < 0.05
    ok = covered and missing == 0 and extra == 0 and rep == 0 and follows
    r["result"] = "yes" if ok else "no"
    r["what_happened"] = (
        f"{NAMES[small]}'s epoch of {need} samples across the resume: "
        + (f"{missing} missing, {extra} repeated" if covered else
           f"not completed ({len(seq_small)} delivered)")
        + f"; repeats in the other sources {rep}; token mixture after the resume "
        f"{[round(f, 3) for f in r['after_fraction']]} for weights {REWEIGHTS}")
    return r


def dp_change_check(peer, seq, k, n, dp_from=2, dp_to=4):
    """Resume with another DP size, for a peer whose loader takes ``rank`` / ``dp``
    (``peer.loader_dp(seq, rank, dp)``, ``peer.resume_dp(seq, state, rank, dp)``): every rank
    of a dp-``dp_from`` run takes ``k`` micro-batches and saves its state; rank r of a
    dp-``dp_to`` run loads the state that rank ``r % dp_from`` saved (there is no other
    state to give it) and takes ``n``.  Compared with the uninterrupted dp-``dp_from`` run
    over as many samples (each old rank ``n * dp_to / dp_from`` more micro-batches): yes
    when the samples after the change are the same (as a multiset, any rank and order),
    i.e. nothing lost and nothing repeated."""
    import pickle
    from collections import Counter

    index = make_index(peer, seq)
    before, states, ref = [], [], []
    for r in range(dp_from):
        it = iter(peer.loader_dp(seq, r, dp_from))
        before += [s for b in take(it, k) for s, _ in index.ids(b)]
        states.append(pickle.loads(pickle.dumps(peer.state(it))))
        ref += [s for b in take(it, n * dp_to // dp_from) for s, _ in index.ids(b)]
        getattr(peer, "close", lambda it: None)(it)
    after = []
    try:
        for r in range(dp_to):
            it = iter(peer.resume_dp(seq, states[r % dp_from], r, dp_to))
            after += [s for b in take(it, n) for s, _ in index.ids(b)]
            getattr(peer, "close", lambda it: None)(it)
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {"result": "no", "what_happened": f"dp {dp_from} -> {dp_to}: "
                f"{type(e).__name__}: {e}"[:300]}
    ca, cr = Counter(after), Counter(ref)
    lost = sum((cr - ca).values())
    seen = Counter(before)
    again = sum(min(v, seen[s]) for s, v in ca.items() if s in seen)
    ok = lost == 0 and ca == cr
    return {"result": "yes" if ok else "no", "not_delivered": lost,
            "repeated_from_before": again, "samples_after": len(after),
            "what_happened": (f"dp {dp_from} -> {dp_to}, new rank r from the state of rank "
                              f"r % {dp_from}: of the {len(ref)} samples the uninterrupted run "
                              f"delivers next, {lost} are not delivered after the change; "
                              f"{again} delivered after it had been delivered before it")}


# ------------------------------------------------- resume with another DP size, one process a rank

def dp_rank(peer, seq, phase, rank, world, from_world, k, n, d):
    """One rank process of ``dp_change_multiproc`` (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR/PORT in the environment, as torchrun sets them).
    save: ``k`` micro-batches, the state (pickled to ``d/state<rank>.pkl``), then
    ``n`` more (what the uninterrupted run delivers next); load: the state of rank
    ``rank % from_world``, ``n`` micro-batches.  Sample ids to ``d/<phase><rank>.json``."""
    import pickle

    index = make_index(peer, seq)
    out = {}
    if phase == "save":
        it = iter(peer.loader_env(seq))
        out["before"] = [s for b in take(it, k) for s, _ in index.ids(b)]
        with open(os.path.join(d, f"state{rank}.pkl"), "wb") as f:
            pickle.dump(peer.state(it), f)
        out["next"] = [s for b in take(it, n) for s, _ in index.ids(b)]
    else:
        with open(os.path.join(d, f"state{rank % from_world}.pkl"), "rb") as f:
            st = pickle.load(f)
        it = iter(peer.loader_env(seq, state=st))
        out["next"] = [s for b in take(it, n) for s, _ in index.ids(b)]
    with open(os.path.join(d, f"{phase}{rank}.json"), "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    kill_descendants()
    os._exit(0)


def dp_change_multiproc(peer, seq, k, n, dp_from=2, dp_to=4):
    """Resume with another DP size for a peer that takes its rank from the process
    environment / torch.distributed (``peer.loader_env(seq, state=None)``): as
    ``dp_change_check``, but each rank is a process of its own, all ranks of a run at once
    (as torchrun starts them): ``dp_from`` processes take ``k`` micro-batches each and
    save their states; then ``dp_to`` processes, rank r loading the state of rank
    r % dp_from (the state the checkpoint holds for it: the same file for every rank where
    the peer's state is global) and taking ``n`` each.  Compared with the samples the
    uninterrupted dp-``dp_from`` ranks deliver next over as many samples."""
    import shutil
    import socket
    import subprocess
    import tempfile
    from collections import Counter

    d = tempfile.mkdtemp(prefix="dpresume_", dir=OUT)
    errs = []

    def launch(phase, world, take_n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        if hasattr(peer, "before_ranks"):
            peer.before_ranks()
        procs = []
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(sys.argv[0]), "dprank", "--seq", str(seq),
                 "--phase", phase, "--rank", str(r), "--world", str(world), "--from-world",
                 str(dp_from), "--k", str(k), "--n", str(take_n), "--dir", d],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for r, p in enumerate(procs):
            try:
                _, err = p.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            if p.returncode != 0:
                errs.append(f"{phase} rank {r}/{world}: " +
                            (err.strip().splitlines() or ["rc %d" % p.returncode])[-1])

    def read(phase, world):
        out = []
        for r in range(world):
            with open(os.path.join(d, f"{phase}{r}.json")) as f:
                out.append(json.load(f))
        return out

    try:
        launch("save", dp_from, n * dp_to // dp_from)
        if errs:
            return {"result": "no", "errors": errs,
                    "what_happened": "no: the dp-%d run failed before its state was saved "
                    "(%s)" % (dp_from, errs[0][:300])}
        saved = read("save", dp_from)
        launch("load", dp_to, n)
        if errs:
            first = errs[0].split(": ", 1)[1]
            return {"result": "no", "refused": True, "errors": errs,
                    "what_happened": f"no: refused at load: {len(errs)} of the dp-{dp_to} "
                    f"ranks raise on the dp-{dp_from} states ({first[:300]})"}
        after = [s for x in read("load", dp_to) for s in x["next"]]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    before = [s for x in saved for s in x["before"]]
    ref = [s for x in saved for s in x["next"]]
    ca, cr = Counter(after), Counter(ref)
    lost = sum((cr - ca).values())
    seen = Counter(before)
    again = sum(min(v, seen[s]) for s, v in ca.items() if s in seen)
    again_ref = sum(min(v, seen[s]) for s, v in cr.items() if s in seen)
    ok = lost == 0 and ca == cr
    return {"result": "yes" if ok else "no", "not_delivered": lost,
            "repeated_from_before": again, "uninterrupted_repeated_from_before": again_ref,
            "samples_after": len(after),
            "samples_before": len(before), "processes": "one per rank",
            "what_happened": (f"dp {dp_from} -> {dp_to}, one process a rank, new rank r "
                              f"from the state of rank r % {dp_from}: of the {len(ref)} "
                              f"samples the uninterrupted run delivers next, {lost} are not "
                              f"delivered after the change; {again} delivered after it had "
                              f"been delivered before it (the uninterrupted run: "
                              f"{again_ref})")}
