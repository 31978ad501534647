"""The installed command for every config: ``run``/``plan``/``index`` of raw-text configs
with an ``hf`` tokenizer (run in the Python package), ``check`` (a pre-flight pass over
every record), ``--help`` listing every command, and the one-line message naming the extra
when ``report --out`` or ``serve`` lack their modules."""

import json
import os
import subprocess
import sys

import pytest
import yaml

import fortunes_corpus as fc
from polyload import __main__ as cli


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return fc.build(tmp_path_factory.mktemp("fortunes"))


def _hf_config(corpus, tmp_path, **overrides):
    cfg = fc.config(corpus, tokenizer={"type": "hf", "path": corpus["tokenizer"]},
                    train_steps=2, **overrides)
    cfg["sources"] = [
        {"name": "tech", "type": "jsonl", "path": os.path.join(corpus["dir"], "tech.jsonl"),
         "weight": 0.6},
        {"name": "wit", "type": "jsonl", "path": os.path.join(corpus["dir"], "wit.jsonl"),
         "weight": 0.4},
    ]
    path = tmp_path / "hf.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _polyload(*args):
    return subprocess.run([sys.executable, "-m", "polyload", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_run_and_plan_with_hf_tokenizer(corpus, tmp_path):
    path = _hf_config(corpus, tmp_path)
    r = _polyload("run", path, "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["steps"] == 2 and st["tokens"] > 0 and set(st["sources"]) == {"tech", "wit"}
    r = _polyload("plan", path, "--steps", "0:2", "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    assert {x["step"] for x in lines} == {0, 1}
    assert all(c[0] in ("tech", "wit") for x in lines for s in x["sequences"]
               for c in s["chunks"])
    r = _polyload("index", path)
    assert r.returncode == 0, r.stderr
    r = _polyload("report", path, "--steps", "0:2", "--json")
    assert r.returncode == 0, r.stderr
    r = _polyload("inspect", path, "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["name"] for x in rows] == ["tech", "wit"]
    assert all(x["type"] == "jsonl" and x["documents"] > 0 and x["tokens"] > 0 for x in rows)


def test_help_lists_every_command():
    r = _polyload("--help")
    assert r.returncode == 0
    for cmd in ("run", "plan", "inspect", "index", "calibrate", "prepare", "check", "report",
                "serve", "top"):
        assert f"\n  {cmd} " in r.stdout, cmd


def test_missing_extra_is_one_line(monkeypatch, capsys, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("matplotlib", "ray") else real(name, *a))
    assert cli.main(["report", "x.yaml", "--steps", "0:1", "--out", str(tmp_path / "r.png")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'polyload[report]'" in err
    assert cli.main(["serve", "x.yaml", "--ray-address", "auto"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'polyload[ray]'" in err


def test_check_finds_every_bad_record(corpus, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": "cut\n'
                   '{"body": "no text key"}\n{"text": "ok"}\n')
    cfg = fc.config(corpus, tokenizer={"type": "hf", "path": corpus["tokenizer"]})
    cfg["sources"] = [{"name": "bad", "type": "jsonl", "path": str(bad), "weight": 1.0}]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = _polyload("check", path)
    assert r.returncode == 1, r.stderr
    assert "line 3" in r.stdout and "line 4" in r.stdout and "key 'text' is missing" in r.stdout
    assert f"{bad}: 2 problems" in r.stdout
    r = _polyload("check", path, "--json")
    res = json.loads(r.stdout)
    assert [p["document"] for p in res["problems"]] == [2, 3]
    assert res["sources"]["bad"]["documents"] == 5
    ok = _hf_config(corpus, tmp_path)
    r = _polyload("check", ok)
    assert r.returncode == 0 and "no problems found" in r.stdout, r.stdout + r.stderr
