"""scripts/check_layers.py: calls between src/'s role folders point down only.

The check itself runs on the library's objects as the ctest test_layers; here
it runs on small object files compiled for the purpose, so that it is seen to
fail on an upward call and on two folders calling each other.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check_layers.py")
CC = shutil.which("cc") or shutil.which("gcc")


def build(tmp_path, files):
    """Compile {"common/a.c": source, ...} into tmp/src/<folder>/<name>.c.o."""
    for rel, text in files.items():
        c = tmp_path / "c" / rel
        c.parent.mkdir(parents=True, exist_ok=True)
        c.write_text(text)
        o = tmp_path / "obj" / "src" / (rel + ".o")
        o.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([CC, "-c", "-o", str(o), str(c)], check=True)
    return tmp_path / "obj"


def check(objdir):
    r = subprocess.run([sys.executable, SCRIPT, "--objdir", str(objdir), "--json"],
                       capture_output=True, text=True)
    return r.returncode, (json.loads(r.stdout) if r.stdout else None)


@pytest.fixture(autouse=True)
def need_cc():
    assert CC, "a C compiler (cc) is needed to build the test objects"


def test_downward_calls_pass(tmp_path):
    objdir = build(tmp_path, {
        "common/alloc.c": "int pl__malloc_n(void) { return 1; }\n",
        "config/keys.c": "int pl__malloc_n(void);\n"
                         "int pl__key_n(void) { return pl__malloc_n(); }\n",
        "runtime/loader.c": "int pl__key_n(void); int pl__malloc_n(void);\n"
                            "int pl_loader_n(void) { return pl__key_n() + pl__malloc_n(); }\n",
    })
    rc, res = check(objdir)
    assert rc == 0
    assert res["objects"] == 3
    assert res["upward"] == [] and res["mutual_folders"] == []
    assert res["folder_map"] == {"config -> common": 1, "runtime -> common": 1,
                                 "runtime -> config": 1}


def test_upward_call_fails(tmp_path):
    # wire/ calling a public function that build/ defines: one upward arrow.
    objdir = build(tmp_path, {
        "build/constructor.c": "int pl_plan_reads(void) { return 2; }\n",
        "wire/package.c": "int pl_plan_reads(void);\n"
                          "int pl_package_n(void) { return pl_plan_reads(); }\n",
    })
    rc, res = check(objdir)
    assert rc == 1
    assert res["upward"] == [{"from": "wire/package.c.o", "symbol": "pl_plan_reads",
                              "defined_in": "build/constructor.c.o",
                              "from_folder": "wire", "to_folder": "build"}]
    assert res["mutual_folders"] == []


def test_folders_calling_each_other_fail(tmp_path):
    objdir = build(tmp_path, {
        "planner/balance.c": "int pl__make_plan(void);\n"
                             "int pl__balance(void) { return pl__make_plan(); }\n",
        "source/source.c": "int pl__balance(void);\n"
                           "int pl__make_plan(void) { return 3; }\n"
                           "int pl__src_n(void) { return pl__balance(); }\n",
    })
    rc, res = check(objdir)
    assert rc == 1
    assert res["mutual_folders"] == [["planner", "source"]]
    assert [u["symbol"] for u in res["upward"]] == ["pl__balance"]


def test_libc_and_unknown_symbols_are_not_arrows(tmp_path):
    # Calls to libc, or to pl_ names no object defines, are not arrows; files of
    # one folder calling each other are reported, not failed.
    objdir = build(tmp_path, {
        "source/a.c": "#include <stdlib.h>\nint pl__b(void); int pl__missing(void);\n"
                      "int pl__a(void) { free(malloc(1)); return pl__b() + pl__missing(); }\n",
        "source/text/b.c": "int pl__a(void);\nint pl__b(void) { return 0; }\n"
                           "int pl__c(void) { return pl__a(); }\n",
    })
    rc, res = check(objdir)
    assert rc == 0
    assert res["folder_map"] == {}
    assert res["mutual_files"] == [{"files": ["source/a.c.o", "source/text/b.c.o"],
                                    "symbols": ["pl__a", "pl__b"]}]


def test_no_objects_is_an_error(tmp_path):
    rc, res = check(tmp_path)
    assert rc == 2 and res is None
