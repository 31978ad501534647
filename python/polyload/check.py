"""``polyload check CONFIG``: a pre-flight pass over everything a config reads.

Parses the config (unknown keys, ranges: the config file and line), opens every source
(paths, the tokenizer loaded, keys such as ``text_key``), then parses every record of every
source: each document's length is computed, which for raw text sources reads and
tokenizes the record (malformed JSON, a missing key, invalid UTF-8, an empty document)
and for WebDataset sources also decodes the image.  Problems are listed by file with the
message the loader would give (file, line or record, byte offset), then summarized.

Exit status: 0 no problem, 1 problems found, 2 the config itself is invalid.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from typing import List, Optional, Sequence

from polyload import _core


def _file_of(message: str) -> str:
    """The file a message names (its leading ``path:``), else ``"(source)"``."""
    head = message.split(": ", 1)[0]
    return head if "/" in head or "." in head else "(source)"


def check(config_path: str, limit: int = 1000, images: bool = True) -> dict:
    """Check a config; returns ``{"config", "sources": {NAME: {"documents", "problems",
    "skipped_at_open"}}, "problems": [{"source", "file", "document", "message"}]}``."""
    cfg = _core.Config.parse_file(config_path)
    out = {"config": config_path, "sources": {}, "problems": []}
    for i in range(cfg.num_sources):
        name = cfg.source_name(i)
        entry = {"documents": 0, "problems": 0, "skipped_at_open": 0}
        out["sources"][name] = entry
        try:
            src = cfg.open_source(i)
        except _core.PolyloadError as e:
            entry["problems"] += 1
            out["problems"].append({"source": name, "file": _file_of(str(e.message or e)),
                                    "document": None, "message": str(e.message or e)})
            continue
        entry["documents"] = src.num_documents
        entry["skipped_at_open"] = src.num_skipped
        wds = src.type == "webdataset"
        for d in range(src.num_documents):
            if len(out["problems"]) >= limit:
                break
            try:
                src.document_length(d)
                if wds and images:
                    src.read_image(d)
            except _core.PolyloadError as e:
                msg = str(e.message or e)
                entry["problems"] += 1
                out["problems"].append({"source": name, "file": _file_of(msg), "document": d,
                                        "message": msg})
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="polyload check",
        description="Parse every record of every source of CONFIG before a run: the "
                    "config, the paths, the tokenizer and every document, with a summary "
                    "of the problems by file.")
    ap.add_argument("config")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--limit", type=int, default=1000,
                    help="stop after this many problems (default 1000)")
    ap.add_argument("--no-images", action="store_true",
                    help="do not decode WebDataset images (headers are still read)")
    a = ap.parse_args(list(argv) if argv is not None else None)
    try:
        res = check(a.config, a.limit, not a.no_images)
    except _core.PolyloadError as e:
        sys.stderr.write(f"polyload: check: {e.message or e}\n")
        return 2
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        by_file: List = collections.Counter(p["file"] for p in res["problems"])
        for p in res["problems"]:
            where = f" (document {p['document']})" if p["document"] is not None else ""
            print(f"{p['source']}{where}: {p['message']}")
        for name, s in res["sources"].items():
            extra = f", {s['skipped_at_open']} left out at open (on_error: skip)" \
                if s["skipped_at_open"] else ""
            print(f"source {name}: {s['documents']} documents, {s['problems']} problems{extra}")
        for f, n in sorted(by_file.items()):
            print(f"  {f}: {n} problem{'s' if n != 1 else ''}")
        total = len(res["problems"])
        print(f"{total} problem{'s' if total != 1 else ''} in {len(by_file)} file"
              f"{'s' if len(by_file) != 1 else ''}" if total else "no problems found")
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())


def inspect_config(argv: Sequence[str]) -> int:
    """``polyload inspect CONFIG [--json]``: the statistics ``polyload inspect PATH`` prints,
    for every source of a config (raw text sources tokenized with the config's tokenizer,
    which may be one only Python provides): one JSON object per source with ``--json``."""
    ap = argparse.ArgumentParser(prog="polyload inspect",
                                 description="Statistics of every source of a config.")
    ap.add_argument("config")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(list(argv))
    try:
        cfg = _core.Config.parse_file(a.config)
        rows = []
        for i in range(cfg.num_sources):
            src = cfg.open_source(i)
            st = src.stats()
            rows.append({"name": cfg.source_name(i), "type": src.type, "path": cfg.source_path(i),
                         "files": st["files"], "documents": st["documents"],
                         "tokens": st["tokens"], "token_dtype": src.token_dtype,
                         "length_percentiles": {"p50": st["length_p50"],
                                                "p90": st["length_p90"],
                                                "p99": st["length_p99"],
                                                "max": st["length_max"]}})
    except _core.PolyloadError as e:
        sys.stderr.write(f"polyload: error: {e.message or e}\n")
        return 2 if isinstance(e, _core.ConfigError) else 1
    for r in rows:
        if a.json:
            print(json.dumps(r))
        else:
            p = r["length_percentiles"]
            print(f"source {r['name']} ({r['type']}, {r['path']}): {r['files']} files, "
                  f"{r['documents']} documents, {r['tokens']} tokens ({r['token_dtype']}), "
                  f"length p50/p90/p99/max {p['p50']} / {p['p90']} / {p['p99']} / {p['max']}")
    return 0
