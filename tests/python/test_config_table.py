"""The config key table as the Python layer and the docs see it: config_keys(),
source_types(), Config.get, Source.type, and docs/reference/config.md kept up to
date by scripts/gen_config_table.py."""
import importlib.util
import os

import pytest

import polyload
from polyload import _core

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gen():
    spec = importlib.util.spec_from_file_location(
        "gen_config_table", os.path.join(ROOT, "scripts", "gen_config_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_docs_config_table_is_current():
    gen = _gen()
    with open(gen.OUT, encoding="utf-8") as f:
        current = f.read()
    assert current == gen.generate(), (
        "docs/reference/config.md is out of date: run python scripts/gen_config_table.py")
    assert gen.main(["--check"]) == 0


def test_docs_check_fails_when_stale(tmp_path):
    gen = _gen()
    stale = tmp_path / "config.md"
    stale.write_text(gen.generate().replace("seq_length", "seq_len", 1))
    assert gen.main(["--check", "--out", str(stale)]) == 1
    assert gen.main(["--out", str(stale)]) == 0
    assert gen.main(["--check", "--out", str(stale)]) == 0


def test_every_key_in_the_docs():
    text = _gen().generate()
    for k in _core.config_keys():
        assert "| `%s` |" % k["name"] in text
    for t in _core.source_types():
        assert "| `%s` |" % t["name"] in text


def test_config_keys_rows():
    keys = _core.config_keys()
    names = [k["name"] for k in keys]
    assert len(names) == len(set(names))
    by = {k["name"]: k for k in keys}
    assert by["seq_length"] == {"name": "seq_length", "type": "integer", "default": "8192",
                                "min": 1, "max": 2**31 - 1, "values": None,
                                "settable": True, "doc": by["seq_length"]["doc"]}
    assert by["packing"]["values"] == ["best_fit", "concat_chunk"]
    assert by["sources[].type"]["values"] == [t["name"] for t in _core.source_types()]
    assert not by["sources[].weight"]["settable"]


def test_source_types_and_constants():
    types = _core.source_types()
    assert [t["name"] for t in types] == ["megatron", "llmc", "flat", "jsonl", "text",
                                          "webdataset", "parquet"]
    assert [t["code"] for t in types] == list(range(1, 8))
    assert [t["name"] for t in types if t["raw_text"]] == ["jsonl", "text", "parquet"]
    for t in types:
        assert getattr(_core, "SOURCE_" + t["name"].upper()) == t["code"]
    with pytest.raises(ValueError, match="one of: megatron, llmc, flat, jsonl, text, "
                                         "webdataset, parquet"):
        _core.Source.open("jsonlines", "x")


def test_config_get_every_settable_key(corpus):
    cfg = _core.Config.parse_string(
        "seq_length: 64\nglobal_batch_size: 4\nsplit: 98,1,1\n"
        "sources:\n  - {name: a, type: megatron, path: %s}\n" % corpus.prefixes[0])
    for k in _core.config_keys():
        if not k["settable"]:
            with pytest.raises(polyload.ConfigError):
                cfg.get(k["name"])
            continue
        v = cfg.get(k["name"])
        if k["type"] in ("integer", "unsigned integer", "integer or null", "integer or auto"):
            assert v is None or isinstance(v, int) or (
                v == "auto" and k["type"] == "integer or auto")
            if isinstance(v, int) and k["type"] != "unsigned integer":
                assert cfg.get_int(k["name"]) == v
        elif k["type"] == "number":
            assert isinstance(v, float)
        elif k["type"] == "fractions":
            assert v == pytest.approx((0.98, 0.01, 0.01))
        else:
            assert isinstance(v, str)
            if k["values"]:
                assert v in k["values"]
    assert cfg.get("seq_length") == 64 and cfg.get("train_steps") is None
    assert cfg.get("packing") == "best_fit" and cfg.get("cost.a") == 1.0
    cfg.set("balance", "greedy")
    assert cfg.get("balance") == "greedy" and cfg.get_int("balance") == 1
    cfg.set("topology.dp", "auto")
    assert cfg.get("topology.dp") == "auto"
    with pytest.raises(polyload.ConfigError, match="did you mean 'seq_length'"):
        cfg.set("seq_lenght", 3)


def test_unknown_key_suggestion_in_yaml(corpus):
    with pytest.raises(polyload.ConfigError) as ei:
        _core.Config.parse_string(
            "global_bach_size: 4\nsources:\n  - {name: a, type: megatron, path: %s}\n"
            % corpus.prefixes[0], origin="t.yaml")
    assert ei.value.message == ("t.yaml:1: unknown key 'global_bach_size' "
                                "(did you mean 'global_batch_size'?)")


def test_source_type_names(corpus):
    src = _core.Source.open("megatron", corpus.prefixes[0])
    assert src.type == "megatron"
