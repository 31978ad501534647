#!/usr/bin/env python3
"""Build the demo corpus from Debian packages into data/.

Four sources of different character, each from an installed Debian package:

    kernel_docs  linux-doc         /usr/share/doc/linux-doc/Documentation/**/*.{rst,txt}[.gz]
                                   (English: translations/ left out)
    python_src   libpython3.11-stdlib  /usr/lib/python3.11/**/*.py
    man_i18n     manpages-{de,fr,ja}   /usr/share/man/{de,fr,ja}/**/*.gz, roff stripped to text
    fortunes     fortunes          /usr/share/games/fortunes/*, split on lines of '%'

Steps, each skipped when its output exists and is newer than its inputs (--force redoes
all):

1. data/raw/<name>.jsonl: one {"text": ..., "source": path} object per document, files in
   sorted path order, at most --max-bytes of text per source (whole documents).
2. data/tokenizer.json: a byte-level BPE (vocab 32000, <|endoftext|> and <pad>) trained
   with `polyload prepare train-tokenizer` on an equal sample of every source.
3. data/<name>_text_document.{bin,idx}: `polyload prepare` with --append-eod.

Prints a table of documents and tokens per source.
"""

import argparse
import glob
import gzip
import json
import os
import re
import sys
import sysconfig
import time

from polyload import prepare as pp

KERNEL_DOCS = "/usr/share/doc/linux-doc/Documentation"
PYTHON_STDLIB = "/usr/lib/python3.11"
MAN_ROOT = "/usr/share/man"
MAN_LANGS = ("de", "fr", "ja")
FORTUNES = "/usr/share/games/fortunes"


def _read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def _walk(root, keep, skip_dirs=()):
    """Regular files under root (no symlinks: they duplicate other files), sorted."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip_dirs]
        for f in files:
            p = os.path.join(dirpath, f)
            if keep(f) and os.path.isfile(p) and not os.path.islink(p):
                out.append(p)
    return sorted(out)


# ------------------------------------------------------------------------ collectors


def kernel_docs():
    root = os.path.realpath(KERNEL_DOCS)
    exts = (".rst", ".txt", ".rst.gz", ".txt.gz")
    for p in _walk(root, lambda f: f.endswith(exts), skip_dirs=("translations",)):
        yield p, _read(p)


def python_src():
    root = PYTHON_STDLIB if os.path.isdir(PYTHON_STDLIB) else sysconfig.get_paths()["stdlib"]
    skip = ("site-packages", "dist-packages", "__pycache__")
    for p in _walk(root, lambda f: f.endswith(".py"), skip_dirs=skip):
        yield p, _read(p)


def man_i18n():
    for lang in MAN_LANGS:
        for p in _walk(os.path.join(MAN_ROOT, lang), lambda f: True):
            src = _read(p)
            if src.lstrip().startswith(".so "):  # a link to another page
                continue
            text = strip_roff(src)
            if text:
                yield p, text


def fortunes():
    def keep(f):
        return not f.endswith((".dat", ".u8"))

    for p in _walk(FORTUNES, keep, skip_dirs=("off",)):
        chunk = []
        for line in _read(p).splitlines() + ["%"]:
            if line.strip() == "%":
                text = "\n".join(chunk).strip("\n")
                if text.strip():
                    yield p, text + "\n"
                chunk = []
            else:
                chunk.append(line)


SOURCES = {
    "kernel_docs": (kernel_docs, "linux-doc"),
    "python_src": (python_src, "libpython3.11-stdlib"),
    "man_i18n": (man_i18n, "manpages-de, manpages-fr, manpages-ja"),
    "fortunes": (fortunes, "fortunes"),
}


# ------------------------------------------------------------------------------- roff

# Requests and macros whose arguments are not text.
_ROFF_DROP = set(
    "TH PP LP P br sp nf fi na ad hy nh ne in ti ll ft ps vs ce RS RE PD TP TQ UC DT "
    "so bp ta tr ev nr rr rm ie el if cc ec eo ss cs mk rt pl po ns rs ls lt fam hw "
    "Dd Dt Os Bl El Bd Ed It Pp Lp Ns Ta Sm EE EX ME UE".split()
)
# Requests that start a block ending with "..".
_ROFF_BLOCK = {"de", "de1", "am", "ami", "ig"}
# Alternating-font macros: arguments join without spaces.
_ROFF_ALT = {"BR", "RB", "IR", "RI", "BI", "IB"}
_ROFF_CHARS = {
    "em": "\u2014", "en": "\u2013", "hy": "-", "bu": "\u2022", "aq": "'", "dq": '"',
    "lq": "\u201c", "rq": "\u201d", "oq": "\u2018", "cq": "\u2019", "co": "\u00a9",
    "rg": "\u00ae", "tm": "\u2122", "mu": "\u00d7", "de": "\u00b0", "ra": "\u2192",
    "la": "\u2190", "Fo": "\u00ab", "Fc": "\u00bb", "ti": "~", "ha": "^", "rs": "\\",
    "ga": "`", "aa": "\u00b4", "lh": "\u261c", "rh": "\u261e", "sc": "\u00a7",
    "ss": "\u00df", "a:": "\u00e4", "o:": "\u00f6", "u:": "\u00fc", "A:": "\u00c4",
    "O:": "\u00d6", "U:": "\u00dc", "e'": "\u00e9", "e`": "\u00e8", "pl": "+", "mi": "-",
    "eq": "=", "<=": "\u2264", ">=": "\u2265", "->": "\u2192", "<-": "\u2190",
    "ul": "_", "ba": "|", "or": "|", "sl": "/", "dg": "\u2020", "ct": "\u00a2",
}
_ROFF_SIMPLE = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "t": "\t",
                "'": "'", "`": "`", ".": "."}
_ARG = r"(?:\[[^\]]*\]|\(..|.)"
_ROFF_ESC = re.compile(
    r"""\\(?:
        "(?P<comment>.*)$
      | [fFkmMgYV]""" + _ARG + r"""
      | \*""" + _ARG + r"""
      | n[+-]?""" + _ARG + r"""
      | s[+-]?(?:\d\d?|\(\d\d|\[[^\]]*\])
      | [hvwlLDbxoXSRZNAuzH]'[^']*'
      | \((?P<c2>..)
      | \[(?P<cn>[^\]]*)\]
      | (?P<c1>.)
    )""",
    re.X,
)
_MDOC = re.compile(r"^[A-Z][a-z][a-z]?$")
_ROFF_ARGS = re.compile(r'"((?:[^"]|"")*)"?|(\S+)')


def _roff_sub(m):
    if m.group("comment") is not None:
        return ""
    name = m.group("c2") or m.group("cn")
    if name is not None:
        if name.startswith("u") and len(name) in (5, 6):
            try:
                return chr(int(name[1:], 16))
            except ValueError:
                return ""
        return _ROFF_CHARS.get(name, "")
    c = m.group("c1")
    if c is not None:
        return _ROFF_SIMPLE.get(c, "" if c in "&|^c%:/,)!pr{}" else c)
    return ""


def _roff_args(rest):
    return [m.group(2) if m.group(1) is None else m.group(1).replace('""', '"')
            for m in _ROFF_ARGS.finditer(rest)]


def strip_roff(src):
    """Crudely turn man(7)/mdoc(7) roff source into plain text: drop comments, layout
    requests and macro definitions, keep the text arguments of font and heading macros,
    map escapes to characters."""
    out = []
    block = False
    for line in src.splitlines():
        if block:
            if line.startswith(".."):
                block = False
            continue
        if line[:1] in (".", "'"):
            m = re.match(r"[.']\s*(\S*)\s*(.*)", line)
            req, rest = m.group(1), m.group(2)
            if not req or req.startswith('\\"') or req in _ROFF_DROP:
                continue
            if req in _ROFF_BLOCK:
                block = True
                continue
            if req in ("ds", "as", "ds1", "as1", "char", "so", "mso", "tm"):
                continue
            args = _roff_args(rest)
            if _MDOC.match(req):  # mdoc: leave out the macro names among the arguments
                args = [a for a in args if not _MDOC.match(a)]
            if req == "IP":
                args = args[:1]
            if not args:
                continue
            line = ("" if req in _ROFF_ALT else " ").join(args)
            if req in ("SH", "SS", "Sh", "Ss"):
                out.append("")
        line = _ROFF_ESC.sub(_roff_sub, line)
        out.append(line.rstrip())
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n" if text.strip() else ""


# ------------------------------------------------------------------------------ steps


def _newer(path, *deps):
    """True when path exists and is newer than every existing dep."""
    if not os.path.exists(path):
        return False
    t = os.path.getmtime(path)
    return all(t >= os.path.getmtime(d) for d in deps if os.path.exists(d))


def write_raw(name, path, max_bytes):
    collect = SOURCES[name][0]
    tmp = f"{path}.tmp{os.getpid()}"
    docs = size = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for src, text in collect():
            n = len(text.encode("utf-8"))
            if docs and size + n > max_bytes:
                break
            f.write(json.dumps({"text": text, "source": src}, ensure_ascii=False) + "\n")
            docs += 1
            size += n
    if docs == 0:
        os.unlink(tmp)
        raise SystemExit(f"build_corpus: source {name}: no documents found "
                         f"(is the Debian package {SOURCES[name][1]} installed?)")
    os.replace(tmp, path)
    return docs, size


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--sources", default=",".join(SOURCES), help="comma-separated subset")
    ap.add_argument("--max-bytes", type=int, default=40 << 20, help="text per source (default 40 MiB)")
    ap.add_argument("--sample-bytes", type=int, default=16 << 20, help="tokenizer training sample")
    ap.add_argument("--workers", type=int, default=None, help="tokenizer threads")
    ap.add_argument("--force", action="store_true", help="rebuild everything")
    args = ap.parse_args(argv)
    names = [n for n in args.sources.split(",") if n]
    for n in names:
        if n not in SOURCES:
            ap.error(f"unknown source {n!r} (have {', '.join(SOURCES)})")
    if args.workers:
        os.environ["RAYON_NUM_THREADS"] = str(args.workers)

    raw_dir = os.path.join(args.data_dir, "raw")
    os.makedirs(raw_dir, exist_ok=True)
    raw = {n: os.path.join(raw_dir, f"{n}.jsonl") for n in names}
    for n in names:
        if args.force or not os.path.exists(raw[n]):
            t0 = time.time()
            docs, size = write_raw(n, raw[n], args.max_bytes)
            print(f"[corpus] {raw[n]}: {docs} documents, {size / 2**20:.1f} MiB "
                  f"({time.time() - t0:.1f} s)", flush=True)

    tok_path = os.path.join(args.data_dir, "tokenizer.json")
    if args.force or not os.path.exists(tok_path):
        t0 = time.time()
        tok = pp.train_tokenizer([raw[n] for n in names], tok_path,
                                 sample_bytes=args.sample_bytes)
        print(f"[corpus] {tok_path}: byte-level BPE, vocab {tok.get_vocab_size()} "
              f"({time.time() - t0:.1f} s)", flush=True)

    rows = []
    for n in names:
        prefix = os.path.join(args.data_dir, f"{n}_text_document")
        if args.force or not _newer(f"{prefix}.idx", raw[n], tok_path, f"{prefix}.bin"):
            t0 = time.time()
            st = pp.prepare([raw[n]], prefix, tok_path, append_eod=True)
            print(f"[corpus] {prefix}.{{bin,idx}}: {st.documents} documents, {st.tokens} tokens "
                  f"({st.writer} writer, {time.time() - t0:.1f} s)", flush=True)
        idx = pp.read_index(prefix)
        rows.append((n, len(idx["sequence_lengths"]), int(idx["sequence_lengths"].sum(dtype="int64")),
                     os.path.getsize(raw[n]) / 2**20))

    print()
    print(f"{'source':<12} {'documents':>10} {'tokens':>12} {'raw MiB':>8}")
    for n, d, t, mb in rows:
        print(f"{n:<12} {d:>10,} {t:>12,} {mb:>8.1f}")
    print(f"{'total':<12} {sum(r[1] for r in rows):>10,} {sum(r[2] for r in rows):>12,} "
          f"{sum(r[3] for r in rows):>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
