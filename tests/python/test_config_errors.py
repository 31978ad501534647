"""Errors about a config's values name the config file and the line: the trainer's world
size against ``topology``, and a tokenizer whose path does not load."""

import pytest

import polyload
from polyload import _core


def test_world_size_error_names_file_and_line(tmp_path):
    data = tmp_path / "t.jsonl"
    data.write_text('{"text": "hello"}\n')
    path = tmp_path / "ws.yaml"
    path.write_text("seq_length: 16\nglobal_batch_size: 4\n\ntopology: {dp: 2}\nsources:\n"
                    f"  - {{name: a, type: jsonl, path: {data}, tokenizer: {{type: bytes}}}}\n")
    cfg = _core.Config.parse_file(str(path))
    with pytest.raises(polyload.ConfigError, match=rf"{path}:4: topology dp=2 .* world size is 3"):
        cfg.set_world_size(3)
    auto = tmp_path / "auto.yaml"
    auto.write_text(path.read_text().replace("{dp: 2}", "{dp: auto, tp: 2}"))
    cfg = _core.Config.parse_file(str(auto))
    with pytest.raises(polyload.ConfigError, match=rf"{auto}:4: topology.dp: auto: .* 3"):
        cfg.set_world_size(3)


def test_tokenizer_path_error_names_file_and_line(tmp_path):
    data = tmp_path / "t.jsonl"
    data.write_text('{"text": "hello"}\n')
    path = tmp_path / "tok.yaml"
    path.write_text("seq_length: 16\nglobal_batch_size: 2\n"
                    "tokenizer: {type: hf, path: /nonexistent/tokenizer.json}\nsources:\n"
                    f"  - {{name: a, type: jsonl, path: {data}}}\n")
    with pytest.raises(polyload.ConfigError,
                       match=rf"{path}:3: tokenizer: .*/nonexistent/tokenizer.json"):
        polyload.Loader(str(path), rank=0)
