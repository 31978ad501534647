"""examples/train_vlm.py trains through the loader on the real photo corpus: every step
sees images, the placeholders hold the merged image features, and the loss goes down."""

import contextlib
import importlib.util
import io
import json
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name, rel):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_train_vlm_loss_goes_down(tmp_path):
    corpus = _load("make_vlm_corpus", "scripts/make_vlm_corpus.py")
    corpus.write_shards(corpus.samples(), str(tmp_path / "vlm"), 8)
    with open(os.path.join(ROOT, "examples", "train_vlm.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg["sources"][0]["path"] = str(tmp_path / "vlm" / "shard-{000000..000003}.tar")
    cfg["sources"][0]["index"] = "memory"
    # Small enough for the suite: 2 sequences of 512 tokens per step, images <= 64 tokens.
    cfg.update(seq_length=512, global_batch_size=2, micro_batch_size=1)
    cfg["sources"][0]["image"]["max_pixels"] = 50176
    path = tmp_path / "cfg" / "train_vlm.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(cfg))
    example = _load("train_vlm", "examples/train_vlm.py")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert example.main(["--config", str(path), "--steps", "4"]) == 0
    steps = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert all(s["images"] > 0 and s["visual_tokens"] > 0 for s in steps)
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.3, steps
