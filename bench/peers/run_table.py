#!/usr/bin/env python3
"""Run every peer harness of bench/peers/ and write the one table of bench/peers/README.md
("Side by side with every peer").

Each harness runs in a fresh process of its own venv (bench/peers/setup_venvs.sh; polyload
and megatron-core in the project's .venv), prints one JSON line per mode; this script
collects them into bench/out/peers/results.json and bench/out/peers/table.md.

- throughput: ``--repeats`` rounds; in each round every loader runs once per seq_length
  (the pairing: a ratio is polyload's figure over the peer's of the same round), median
  of the rounds reported with the range;
- startup: wall clock from before the fork of ``VENV/bin/python HARNESS startup`` to the
  first micro-batch in that process, imports included; 1 file and 2,000 files; median of
  ``--startup-repeats`` (the first run of each warms the page cache and builds caches);
- mixture (100 steps), resume (K=120), weight change at resume (K=128 and K=120),
  resume with another DP size: once each (deterministic).

Usage: .venv/bin/python bench/peers/run_table.py [--only NAME,...] [--repeats 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "bench", "out", "peers")
sys.path.insert(0, os.path.dirname(HERE))
import results as bench_results  # noqa: E402
PROJECT_PY = os.path.join(ROOT, ".venv", "bin", "python")

# key, venv ('' = the project's .venv), harness, how its sequences are built
PEERS = [
    ("polyload", "", "peer_polyload.py", "packed (best_fit)"),
    ("megatron-core", "", "peer_megatron.py", "concatenated"),
    ("torchdata", "torchdata", "peer_torchdata.py", "concatenated"),
    ("torchdata.nodes", "torchdata", "peer_torchdata_nodes.py", "concatenated"),
    ("streaming", "streaming", "peer_streaming.py", "concatenated"),
    ("grain", "grain", "peer_grain.py", "concatenated"),
    ("litdata", "litdata", "peer_litdata.py", "concatenated"),
    ("raydata", "raydata", "peer_raydata.py", "concatenated"),
]
SEQS = (2048, 8192)
PSS_SOURCES = (30, 300)
PSS_ONE_PROCESS = {"raydata"}  # runs its ranks itself (a Ray cluster, an actor per rank)
PSS_CLEAN_AFTER = {"streaming"}  # pssprep clears what its ranks left in /dev/shm


def python_of(venv):
    if not venv:
        return PROJECT_PY, None
    d = os.path.join(HERE, ".venvs", venv)
    if not os.path.exists(os.path.join(d, ".ok")):
        err = os.path.join(HERE, ".venvs", venv + ".install-error")
        msg = open(err).read().strip() if os.path.exists(err) else "venv missing"
        return None, "not installed: " + msg[-300:]
    return os.path.join(d, "bin", "python"), None


def run(py, script, args, timeout):
    t0 = time.time()
    cmd = [py, os.path.join(HERE, script)] + args
    if args and args[0] == "startup":
        cmd += ["--t0", repr(t0)]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in reversed(p.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {p.returncode}: " + " | ".join(tail)[-400:]}


def pss_run(key, py, script, n, world, timeout=900):
    """PSS of every process of ``world`` ranks of one loader over n sources: one process
    per rank (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT in its
    environment, as torchrun sets them), or one process running them all
    (PSS_ONE_PROCESS); measured 2 s after every rank has taken its micro-batches."""
    import signal
    import shutil

    sys.path.insert(0, HERE)
    import common as C

    d = os.path.join(OUT, "pss", "run", f"{key}-{n}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    prep = run(py, script, ["pssprep", "--sources", str(n)], 1800)  # idempotent; clears shm
    if "error" in prep:
        return {"error": "prepare: " + prep["error"]}
    ranks = [-1] if key in PSS_ONE_PROCESS else list(range(world))
    port = str(29500 + (os.getpid() + n) % 2000)
    procs = []
    t0 = time.time()
    for r in ranks:
        env = dict(os.environ, RANK=str(max(r, 0)), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(max(r, 0)), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen(
            [py, os.path.join(HERE, script), "pssrank", "--sources", str(n), "--rank",
             str(r), "--world", str(world), "--ready", os.path.join(d, f"ready{r}")],
            cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(d, f"rank{r}.err"), "w")))
    pids = []
    try:
        while not all(os.path.exists(os.path.join(d, f"ready{r}")) for r in ranks):
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                err = open(os.path.join(d, f"rank{ranks[procs.index(dead[0])]}.err")).read()
                return {"error": f"rank exited with {dead[0].returncode}: " +
                        " | ".join(err.strip().splitlines()[-3:])[-400:]}
            if time.time() - t0 > timeout:
                return {"error": f"not ready after {timeout} s"}
            time.sleep(0.5)
        ready_s = time.time() - t0
        time.sleep(2)
        pids = C.process_tree([p.pid for p in procs])
        out = C.pss_sum(pids)
        out.update(sources=n, ranks=world, rank_processes=len(procs), ready_s=ready_s)
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # Ray Data's rank process shuts Ray down
        deadline = time.time() + 30
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        for q in set(pids) | {p.pid for p in procs}:  # whatever is left of the trees
            try:
                os.kill(q, signal.SIGKILL)
            except OSError:
                pass
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
        if key in PSS_CLEAN_AFTER:  # the ranks' shared memory, left by their SIGTERM exit
            run(py, script, ["pssprep", "--sources", str(n)], 300)


def log(*a):
    print(*a, flush=True)
    with open(os.path.join(OUT, "run_table.log"), "a") as f:
        print(*a, file=f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma-separated keys of PEERS")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--startup-repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="timed window per run")
    ap.add_argument("--skip", default="", help="comma-separated parts: throughput,startup,"
                    "mixture,resume,reweight,dpresume,pss")
    ap.add_argument("--pss-ranks", type=int, default=8, help="ranks of the PSS column")
    ap.add_argument("--results", default="results.json",
                    help="file under bench/out/peers/ (a second run can fill other parts "
                    "into another file; the table merges results*.json)")
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    only = set(filter(None, a.only.split(",")))
    skip = set(filter(None, a.skip.split(",")))
    peers = [p for p in PEERS if not only or p[0] in only]
    path = os.path.join(OUT, a.results)
    res = json.load(open(path)) if os.path.exists(path) else {}
    for key, venv, script, _ in peers:
        py, err = python_of(venv)
        r = res.setdefault(key, {})
        if err:
            r["not_installed"] = err
            continue
        r.pop("not_installed", None)
        for seq in SEQS if "prepare" not in skip else ():
            out = run(py, script, ["prepare", "--seq", str(seq)], 1200)
            log(key, "prepare", seq, out)

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    if "throughput" not in skip:
        for key, _, _, _ in peers:
            res[key]["throughput"] = {str(s): [] for s in SEQS}
        for rnd in range(a.repeats):
            for seq in SEQS:
                for key, venv, script, _ in peers:
                    py, err = python_of(venv)
                    if err:
                        continue
                    out = run(py, script, ["throughput", "--seq", str(seq), "--seconds",
                                           str(a.seconds)], 900)
                    res[key]["throughput"][str(seq)].append(out)
                    log("round", rnd, key, seq, {k: out.get(k) for k in
                                                  ("tokens_per_s", "cpu_s_per_mtok", "error")})
            save()
        record_throughput(res, a.repeats)
    if "startup" not in skip:
        for key, venv, script, _ in peers:
            py, err = python_of(venv)
            if err:
                continue
            res[key]["startup"] = {}
            for files in ("1", "2000"):
                runs = [run(py, script, ["startup", "--files", files], 600)
                        for _ in range(a.startup_repeats)]
                res[key]["startup"][files] = runs
                log(key, "startup", files, [x.get("first_batch_s", x.get("error")) for x in runs])
            save()
    if "pss" not in skip:
        for key, venv, script, _ in peers:
            py, err = python_of(venv)
            if err:
                continue
            res[key]["pss"] = {}
            for n in PSS_SOURCES:
                out = pss_run(key, py, script, n, a.pss_ranks)
                res[key]["pss"][str(n)] = out
                log(key, "pss", n, {k: out.get(k) for k in ("pss_mib", "processes", "error")})
                if "error" in out:
                    break
            save()
    checks = [("mixture", ["mixture", "--steps", "100"]), ("resume", ["resume", "--k", "120"]),
              ("reweight", ["reweight", "--k", "128"]),
              ("reweight_mid", ["reweight", "--k", "120"]), ("dpresume", ["dpresume"])]
    for name, args in checks:
        if name.split("_")[0] in skip:
            continue
        for key, venv, script, _ in peers:
            py, err = python_of(venv)
            if err:
                continue
            out = run(py, script, args, 1200)
            res[key][name] = out
            log(key, name, json.dumps(out)[:400])
            save()
    save()
    write_table(load_all())


def load_all():
    """results*.json of bench/out/peers merged (per loader, per part)."""
    import glob

    res = {}
    for p in sorted(glob.glob(os.path.join(OUT, "results*.json"))):
        for key, parts in json.load(open(p)).items():
            res.setdefault(key, {}).update(parts)
    return res


def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, digits=3):
    if x is None:
        return "–"
    return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:.{digits}g}".replace("e+0", "e")


def e(x):
    """3 significant digits, 1.23e6 style."""
    m, x_ = f"{x:.3g}", x
    return m.replace("e+0", "e").replace("e+", "e")


def record_throughput(res, repeats):
    """polyload's and megatron-core's median tokens/s at 2048 into bench/results/peers.json
    (every peer's figures stay in the table of bench/peers/README.md)."""
    def median_tps(key):
        runs = res.get(key, {}).get("throughput", {}).get("2048", [])
        tps = [r["tokens_per_s"] for r in runs if "tokens_per_s" in r]
        return statistics.median(tps) if tps else None
    p, m = median_tps("polyload"), median_tps("megatron-core")
    if p:
        extra = {"peer": "megatron-core", "peer_value": m} if m else {}
        print(bench_results.write("peers", [bench_results.record(
            f"non-padding tokens/s into the same loop, 2048-token sequences, median of "
            f"{repeats} rounds", p, "tokens/s", note="every peer: bench/peers/README.md",
            **extra)]))


def throughput_cell(res, key, seq):
    runs = res.get(key, {}).get("throughput", {}).get(str(seq), [])
    ok = [r for r in runs if "tokens_per_s" in r]
    if not ok:
        errs = [r.get("error") for r in runs if "error" in r]
        return ("no: " + errs[0][:120]) if errs else "–", "–", None
    tps = [r["tokens_per_s"] for r in ok]
    cpu = [r["cpu_s_per_mtok"] for r in ok]
    pl = [r.get("tokens_per_s") for r in res.get("polyload", {}).get("throughput", {})
          .get(str(seq), [])]
    ratios = [p / t for p, t in zip(pl, [r.get("tokens_per_s") for r in runs]) if p and t]
    cell = f"{e(med(tps))}"
    if key != "polyload" and ratios:
        cell += f" (**{med(ratios):.3g}x**)"
    detail = (f"{len(ok)} runs {e(min(tps))}–{e(max(tps))}" +
              (f", ratios {min(ratios):.3g}–{max(ratios):.3g}x" if key != "polyload" and ratios
               else ""))
    return cell, f"{med(cpu):.3g}", detail


def startup_cell(res, key, files):
    runs = res.get(key, {}).get("startup", {}).get(files, [])
    ok = [r["first_batch_s"] for r in runs if r.get("first_batch_s") is not None]
    if not ok:
        errs = [r.get("error") for r in runs if "error" in r]
        return ("no: " + errs[0][-160:]) if errs else "–"
    return f"{med(ok):.2f} s"


def startup_detail(res, key):
    out = []
    for files in ("1", "2000"):
        runs = res.get(key, {}).get("startup", {}).get(files, [])
        ok = [f"{r['first_batch_s']:.2f}" for r in runs if r.get("first_batch_s") is not None]
        if ok:
            out.append(f"{files} file{'s' if files != '1' else ''}: " + ", ".join(ok) + " s")
    return "; ".join(out)


def check_cell(r):
    if not r:
        return "–"
    if "error" in r:
        return "no: " + r["error"][:160]
    if r.get("result") == "yes":
        return "yes"
    what = r.get("what_happened", "")
    res = r.get("result", "?")
    return what if what.startswith(res) else f"{res}: {what}"


def short(r, part):
    """The table's short form of a check; the long form goes under the table."""
    if not r:
        return "–"
    if "error" in r:
        return "no: error (below)"
    res = r.get("result")
    if res == "yes":
        return "yes"
    if part == "resume":
        if "first_difference" in r:
            return (f"no: differs from micro-batch {r['first_difference']}; "
                    f"{r.get('same_samples_any_order')} of {2 * r['compared']} sequences "
                    "the same, in another order")
        return "no: no state API"
    if part == "dp":
        if "not_delivered" in r:
            return (f"no: {r['not_delivered']} of {r['samples_after']} next samples not "
                    "delivered")
        if res == "not measured":
            return "not measured (below)"
        return r.get("what_happened", "no").split(", so")[0].split(" (")[0]
    if part == "reweight":
        if "missing_in_epoch" in r:
            t = (f"no: {r['missing_in_epoch']} lost, {r['repeated_in_epoch']} repeated in "
                 f"{r['small_source']}, {r['repeated_other_sources']} repeats elsewhere")
            if r.get("control_without_resume", {}).get("result") == "no":
                t += " (without a resume too)"
            return t
        if "whole_documents_after" in r:
            return (f"no: {r['repeated_from_before']} of {r['whole_documents_after']} documents "
                    f"repeated ({r['control_without_resume_repeated']} without a resume)")
        return "no: no state API"
    return res


def pss_cells(res, key):
    """(cell, detail) of the PSS column: PSS of all processes at 30 and 300 sources and
    per added source, (PSS(300) - PSS(30)) / 270."""
    runs = res.get(key, {}).get("pss", {})
    if not runs:
        return "–", ""
    lo, hi = (runs.get(str(n), {}) for n in PSS_SOURCES)
    bad = [(n, r) for n, r in zip(PSS_SOURCES, (lo, hi)) if "error" in r or not r]
    if bad:
        n, r = bad[0]
        return f"no at {n} sources: error (below)", f"PSS at {n} sources: {r.get('error', 'not run')}"
    span = PSS_SOURCES[1] - PSS_SOURCES[0]
    per = (hi["pss_mib"] - lo["pss_mib"]) / span
    anon = (hi["pss_anon_mib"] - lo["pss_anon_mib"]) / span
    cell = f"{lo['pss_mib']:,.0f} / {hi['pss_mib']:,.0f} MiB (**{per:.3f}** MiB)"
    how = "one driver process, a Ray actor per rank" if lo.get("rank_processes") == 1 else \
        f"{lo.get('rank_processes')} rank processes"
    top = ", ".join(f"{c} {v:,.0f}" for c, v in list(hi.get("by_command_mib", {}).items())[:4])
    own = (hi["pss_own_mib"] - lo["pss_own_mib"]) / span
    detail = (f"PSS: {how}, {lo['processes']} / {hi['processes']} processes in all at "
              f"{PSS_SOURCES[0]} / {PSS_SOURCES[1]} sources; per added source anon "
              f"{anon:.3f} MiB, file {(hi['pss_file_mib'] - lo['pss_file_mib']) / span:.3f}"
              f" MiB, without shared-library pages {own:.3f} MiB; largest at "
              f"{PSS_SOURCES[1]} (MiB by command): {top}")
    return cell, detail


def write_table(res):
    head = ("| loader | sequences | non-padding tokens/s, 2048 (polyload ÷ peer) | CPU-s per "
            "M tokens | tokens/s, 8192 (polyload ÷ peer) | CPU-s per M tokens | start to "
            "first batch, 1 file | 2,000 files | mixture error per step, max tokens "
            "(cumulative) | realized mixture (for 0.4/0.3/0.2/0.1) | exact resume, next 100 "
            "micro-batches | resume with another DP size | weight change at resume | "
            "padding fraction | PSS of all processes, 8 ranks, 30 / 300 sources (per added "
            "source) |")
    rows = [head, "|" + "---|" * 15]
    details = []
    for key, _, _, how in PEERS:
        r = res.get(key)
        if not r:
            continue
        if r.get("not_installed"):
            rows.append(f"| {key} | | no: {r['not_installed']} |" + " |" * 12)
            continue
        t2, c2, d2 = throughput_cell(res, key, 2048)
        t8, c8, d8 = throughput_cell(res, key, 8192)
        m = r.get("mixture", {})
        if "per_step_max" in m:
            mix = f"{m['per_step_max']:.0f} ({m['cumulative_max']:.0f})"
            real = "/".join(f"{x:.3f}" for x in m["realized_fraction"])
        else:
            mix, real = check_cell(m), "–"
        pads = [x.get("padding_fraction") for x in r.get("throughput", {}).get("2048", [])
                if "padding_fraction" in x]
        pss_cell, pss_detail = pss_cells(res, key)
        rw = short(r.get("reweight"), "reweight")
        rwm = r.get("reweight_mid")
        if key == "polyload" and rwm:
            rw = f"{rw} at a step boundary; mid-step {short(rwm, 'reweight')}"
        rows.append(" | ".join([
            f"| {key}", how, t2, c2, t8, c8, startup_cell(res, key, "1"),
            startup_cell(res, key, "2000"), mix, real, short(r.get("resume"), "resume"),
            short(r.get("dpresume"), "dp"), rw,
            (f"{med(pads):.2g}" if pads else "–"), pss_cell]) + " |")
        lines = [f"throughput 2048: {d2}; 8192: {d8}" if d2 else "",
                 ("start-up runs: " + startup_detail(res, key)) if startup_detail(res, key)
                 else "", pss_detail]
        for part, label in (("resume", "exact resume"), ("dpresume", "other DP size"),
                            ("reweight", "weight change (K=128)"),
                            ("reweight_mid", "weight change (K=120)")):
            if r.get(part) and r[part].get("result") != "yes" or part == "dpresume" and \
                    r.get(part):
                lines.append(f"{label}: {check_cell(r[part])}")
        details.append(f"- **{key}**: " + "; ".join(x for x in lines if x) + ".")
    text = "\n".join(rows) + "\n\n" + "\n".join(details) + "\n"
    with open(os.path.join(OUT, "table.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--table-only":
        write_table(load_all())
    else:
        main()
