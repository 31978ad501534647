"""The documents: every relative link resolves (scripts/check_links.py), the generated
figures tables are up to date with bench/results/*.json (bench/make_tables.py), every
results record is complete and names a command that exists, and user-facing documents
carry no work-tracking references."""
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check_links = _load("check_links", "scripts/check_links.py")
results = _load("bench_results", "bench/results.py")


def test_every_relative_link_resolves():
    assert check_links.check() == []


def test_link_checker_finds_broken_links_and_anchors(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section: with `code`\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Doc\n\n"
        "[fine](other.md) [fine too](other.md#a-section-with-code) [self](#doc)\n"
        "[missing](missing.md) [bad anchor](other.md#no-such-heading) [bad self](#nope)\n"
        "[web](https://example.com/x.md)\n"
        "```\n[in code](also-missing.md)\n```\n")
    errors = check_links.check([str(doc)])
    assert len(errors) == 3, errors
    assert any("missing.md does not exist" in e for e in errors)
    assert any("no heading #no-such-heading" in e for e in errors)
    assert any("no heading #nope" in e for e in errors)
    assert all(":4:" in e for e in errors)


def test_anchor_follows_github():
    assert check_links.anchor("Decode + resize, polyload vs `webdataset`") == \
        "decode--resize-polyload-vs-webdataset"
    assert check_links.anchor("State blob (`PLST`)") == "state-blob-plst"


def test_generated_tables_are_up_to_date():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_tables.py"),
                        "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _records():
    files = sorted(glob.glob(os.path.join(ROOT, "bench", "results", "*.json")))
    assert files
    for path in files:
        with open(path, encoding="utf-8") as f:
            yield path, json.load(f)


def test_results_records_are_complete():
    headlines = 0
    for path, recs in _records():
        results.check(recs, path)  # raises on a missing or unknown field
        assert recs, path
        for r in recs:
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]), (path, r["date"])
            assert r["machine"]["cores"] >= 1 and r["machine"]["cpu"], path
            assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?|unknown", r["commit"]), path
            headlines += bool(r.get("headline"))
        figures = [r["figure"] for r in recs]
        assert len(figures) == len(set(figures)), f"{path}: a figure twice"
    assert headlines >= 5


def test_results_commands_name_existing_scripts():
    for path, recs in _records():
        for r in recs:
            for tok in r["command"].split():
                tok = tok.strip("\"'")
                if tok.startswith("bench/") and tok.endswith((".py", ".sh")):
                    assert os.path.exists(os.path.join(ROOT, tok)), (path, tok)


def test_results_write_merges_by_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS", str(tmp_path))
    a = results.record("throughput", 1.0, "tokens/s", command="x")
    b = results.record("latency", 2.0, "ms", command="y", lower_is_better=True)
    results.write("t", [a, b])
    a2 = results.record("throughput", 3.0, "tokens/s", command="x2", headline=True)
    results.write("t", [a2])
    got = {r["figure"]: r for r in results.load("t")}
    assert got["throughput"]["value"] == 3.0 and got["throughput"]["headline"] is True
    assert got["latency"]["value"] == 2.0
    for r in got.values():
        assert set(results.REQUIRED) <= set(r)
    with pytest.raises(ValueError):
        results.record("bad", 1.0, "x", command="z", colour="red")
    with pytest.raises(ValueError):
        results.write("t", [{"figure": "no value"}])


USER_FACING = ["README.md", "CONTRIBUTING.md", "bench/README.md", "docs"]
TRACKING = re.compile(r"\b[Ii]ssues? \d+|\b[Ss]tops? \d+|\bbranch(es)? h\d+")


def test_user_facing_documents_carry_no_tracking_references():
    found = []
    for doc in check_links.documents(USER_FACING):
        with open(doc, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if TRACKING.search(line):
                    found.append(f"{os.path.relpath(doc, ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_readme_is_short():
    assert os.path.getsize(os.path.join(ROOT, "README.md")) <= 12 * 1024


CODE = ["src", "include", "python", "cli", "bench", "scripts", "tests", "Makefile",
        "CMakeLists.txt", ".ci"]
DOC_PATH = re.compile(r"\b(docs/[\w./-]+?\.md)\b")
DESIGN_SECTION = re.compile(r'docs/internals/design\.md,\s*(?:\*\s*)?"([^"]+)"')


def _code_files():
    for p in CODE:
        full = os.path.join(ROOT, p)
        if os.path.isfile(full):
            yield full
            continue
        for d, dirs, files in os.walk(full):
            dirs[:] = [x for x in dirs if not x.startswith(".") and x not in ("out", "corpus")]
            for f in files:
                if f.endswith((".c", ".h", ".cc", ".py", ".pyi", ".sh", ".txt", ".yaml")):
                    yield os.path.join(d, f)


def test_documents_cited_from_code_exist():
    """Code comments cite docs/ paths and design.md sections instead of benchmark
    sections: each must exist (a comment may wrap between the path and the section)."""
    design = os.path.join(ROOT, "docs", "internals", "design.md")
    headings = {h for _, h in check_links._headings(design)}
    missing = []
    for path in _code_files():
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in DOC_PATH.finditer(text):
            rel = m.group(1)
            if not os.path.exists(os.path.join(ROOT, rel)) and rel not in check_links.PENDING:
                missing.append(f"{os.path.relpath(path, ROOT)}: {rel}")
        flat = re.sub(r"\s*\n\s*(?:\*|#:?|//)?\s*", " ", text)
        for m in DESIGN_SECTION.finditer(flat):
            if m.group(1) not in headings:
                missing.append(f"{os.path.relpath(path, ROOT)}: design.md \"{m.group(1)}\"")
    assert missing == []
