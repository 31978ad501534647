"""Files written by megatron-core's own IndexedDatasetBuilder read back identically through
polyload._core.Source, compared sequence by sequence with megatron-core's IndexedDataset."""

import warnings

import numpy as np
import pytest

from polyload import _core

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    idx = pytest.importorskip("megatron.core.datasets.indexed_dataset")

# Every integer dtype megatron-core's DType enum allows (codes 1..5 and 8); its float
# codes (6, 7) hold no token ids and are refused.
DTYPES = [getattr(np, d.name) for d in idx.DType if not d.name.startswith("float")]
FLOAT_DTYPES = [getattr(np, d.name) for d in idx.DType if d.name.startswith("float")]


def test_dtype_codes_match_megatron():
    assert {d.name: d.value for d in idx.DType} == {
        _core.dtype_name(code): code for code in range(1, 9)
    }


def _values(rng, dtype, n):
    if np.issubdtype(dtype, np.floating):  # integer-valued, exact in float32
        return rng.integers(-(1 << 23), 1 << 23, size=n).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dtype)


def _build(prefix, dtype, seed):
    """Documents of 1..300 tokens; some documents hold several sequences (add_document),
    others one (add_item + end_document), as Megatron's preprocess_data writes them."""
    rng = np.random.default_rng(seed)
    b = idx.IndexedDatasetBuilder(idx.get_bin_path(prefix), dtype=dtype)
    for i in range(60):
        if i % 3 == 0:
            lengths = [int(x) for x in rng.integers(1, 300, size=3)]
            b.add_document(_values(rng, dtype, sum(lengths)), lengths)
        else:
            b.add_item(torch.from_numpy(_values(rng, dtype, int(rng.integers(1, 300)))))
            b.end_document()
    b.finalize(idx.get_idx_path(prefix))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_builder_files_read_identically(tmp_path, dtype):
    prefix = str(tmp_path / f"data_{dtype.__name__}")
    _build(prefix, dtype, seed=DTYPES.index(dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = idx.IndexedDataset(prefix)
    src = _core.Source.open("megatron", prefix)
    assert src.token_dtype == dtype.__name__
    assert src.num_documents == len(ref)
    lengths = np.asarray(ref.sequence_lengths)
    st = src.stats()
    assert st["documents"] == len(ref) and st["tokens"] == int(lengths.sum())
    assert st["length_max"] == int(lengths.max())
    for i in range(len(ref)):
        want = np.asarray(ref[i])
        assert src.document_length(i) == len(want)
        got = np.asarray(src.read(i))
        assert got.dtype == np.int64
        # float token files are truncated toward zero; the values are integers here
        np.testing.assert_array_equal(got, want.astype(np.int64), err_msg=f"document {i}")
        if len(want) > 2:  # partial reads, and the int32 output
            np.testing.assert_array_equal(np.asarray(src.read(i, 1, len(want) - 2)),
                                          want[1:-1].astype(np.int64))
            if np.iinfo(np.int32).min <= want.min() and want.max() <= np.iinfo(np.int32).max:
                np.testing.assert_array_equal(np.asarray(src.read(i, dtype="int32")),
                                              want.astype(np.int32))


def test_merged_with_add_index(tmp_path):
    """A dataset merged by IndexedDatasetBuilder.add_index (as tools/merge_datasets.py)."""
    parts = []
    for k in range(2):
        p = str(tmp_path / f"part{k}")
        _build(p, np.uint16, seed=10 + k)
        parts.append(p)
    merged = str(tmp_path / "merged")
    b = idx.IndexedDatasetBuilder(idx.get_bin_path(merged), dtype=np.uint16)
    for p in parts:
        b.add_index(p)
    b.finalize(idx.get_idx_path(merged))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = idx.IndexedDataset(merged)
    src = _core.Source.open("megatron", merged)
    assert src.num_documents == len(ref)
    for i in range(len(ref)):
        np.testing.assert_array_equal(np.asarray(src.read(i)), np.asarray(ref[i]).astype(np.int64))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.__name__)
def test_float_builder_files_refused(tmp_path, dtype):
    prefix = str(tmp_path / f"data_{dtype.__name__}")
    _build(prefix, dtype, seed=0)
    with pytest.raises(Exception, match="not a token dtype") as e:
        _core.Source.open("megatron", prefix)
    assert "offset 17" in str(e.value) and dtype.__name__ in str(e.value)
