"""The checkers and the shared sample layout of the image-text peer benchmark
(bench/peers/vlm_common.py) on hand-made deliveries: mixture per step from sample keys,
resume comparison, caption tokens, the peers' collate and Pillow resize.  The peer
libraries (Energon, WebDataset) are not needed."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "peers"))
import vlm_common as V  # noqa: E402


def test_mixture_steps_counts_tokens_per_source_and_step():
    cat = {"a0": (0, 700), "a1": (0, 800), "b0": (1, 600), "b1": (1, 900)}
    keys = ["a0", "b0", "a1", "a1", "b1", "a0", "a0"]  # the last (partial) step is left out
    rows = V.mixture_steps(keys, cat, step_samples=3)
    assert rows == [[1500, 600], [1500, 900]]
    m = V.mixture_report(rows)
    # weights 0.7/0.3: step 0 has 2100 tokens -> 1470/630 (off by 30); step 1 2400 ->
    # 1680/720 (off by 180); cumulative 4500 -> 3150/1350 (off by 150)
    assert m["per_step_max"] == pytest.approx(180.0)
    assert m["cumulative_max"] == pytest.approx(150.0)
    assert m["per_step_max_fraction"] == pytest.approx(180.0 / 2250.0)
    assert m["realized_fraction"] == pytest.approx([2 / 3, 1 / 3])


def test_resume_report_exact_and_not():
    assert V.resume_report(["x", "y", "z"], ["x", "y", "z"])["exact"] is True
    r = V.resume_report(["x", "y", "z"], ["x", "q", "z"])
    assert r["exact"] is False and r["equal_micro_batches"] == 2 and r["first_difference"] == 1
    r = V.resume_report(["x", "y"], ["x"])  # fewer micro-batches delivered: not exact
    assert r["exact"] is False


def test_caption_tokens_and_collate():
    assert V.caption_ids(b"hi") == [104, 105, V.EOS]
    assert V.caption_ids("é") == [0xC3, 0xA9, V.EOS]
    im = np.zeros((3, V.SIZE, V.SIZE), dtype=np.uint8)
    b = V.collate([("k0", im, [1, 2, V.EOS]), ("k1", im + 1, [3, V.EOS])])
    assert b["keys"] == ["k0", "k1"]
    assert tuple(b["pixel_values"].shape) == (2, 3, V.SIZE, V.SIZE)
    assert int(b["pixel_values"][1].sum()) == 3 * V.SIZE * V.SIZE
    assert b["input_ids"].tolist() == [[1, 2, V.EOS], [3, V.EOS, V.PAD]]
    # the same micro-batch hashes the same; another differs
    assert V.batch_key(b) == V.batch_key(V.collate([("k0", im, [1, 2, V.EOS]),
                                                    ("k1", im + 1, [3, V.EOS])]))
    assert V.batch_key(b) != V.batch_key(V.collate([("k0", im, [1, 2, V.EOS]),
                                                    ("k1", im, [3, V.EOS])]))


def test_pillow_fixed_resizes_the_shorter_side_and_crops_the_centre():
    from PIL import Image

    # 200 x 100 (w x h): left half red, right half blue; the centre crop of the 672 x 336
    # resize keeps the middle, half red, half blue
    a = np.zeros((100, 200, 3), dtype=np.uint8)
    a[:, :100, 0] = 255
    a[:, 100:, 2] = 255
    out = V.pillow_fixed(Image.fromarray(a))
    assert out.shape == (3, V.SIZE, V.SIZE) and out.dtype == np.uint8
    assert out[0, :, :150].min() > 200 and out[2, :, :150].max() < 50
    assert out[2, :, -150:].min() > 200 and out[0, :, -150:].max() < 50
