"""The numpy data of the torchdata harnesses (torchdata has no storage format of its own):
each source's samples as one ``.npy`` (uint16 [n, seq+1], written by ``numpy.save``), read
memory-mapped; the start-up sets: kernel_docs as 1 file, and all samples in 2,000 files."""
import os

import numpy as np

import common as C


def data_dir(seq):
    return os.path.join(C.OUT, "npy", str(seq))


def prepare(seq):
    d = data_dir(seq)
    if os.path.exists(os.path.join(d, "files2000", "f1999.npy")):
        return
    os.makedirs(os.path.join(d, "files2000"), exist_ok=True)
    samples = C.all_samples(seq)
    for name, s in zip(C.NAMES, samples):
        np.save(os.path.join(d, name + ".npy"), s)
    alls = np.concatenate(samples)
    for i, part in enumerate(np.array_split(alls, 2000)):
        np.save(os.path.join(d, "files2000", f"f{i:04d}.npy"), part)


def pss_files(n):
    return [[os.path.join(C.pss_dir("npy"), f"s{i:04d}.npy")] for i in range(n)]


def pss_prepare(n):
    """The PSS column's n sources, one .npy each."""
    if os.path.exists(pss_files(n)[-1][0]):
        return
    os.makedirs(C.pss_dir("npy"), exist_ok=True)
    for (path,), s in zip(pss_files(n), C.pss_samples(n)):
        np.save(path, s)


def source_files(seq, files="4"):
    """[[paths] per source] for the main mixture ('4'), '1' or '2000' files."""
    d = data_dir(seq)
    if files == "1":
        return [[os.path.join(d, "kernel_docs.npy")]]
    if files == "2000":
        return [[os.path.join(d, "files2000", f"f{i:04d}.npy") for i in range(2000)]]
    return [[os.path.join(d, n + ".npy")] for n in C.NAMES]


class Rows:
    """Rows of a list of .npy files as one indexable source (opened lazily, so that each
    worker process maps the files itself)."""

    def __init__(self, paths):
        self.paths = paths
        self.counts = []
        for p in paths:
            with open(p, "rb") as f:
                np.lib.format.read_magic(f)
                shape, _, _ = np.lib.format.read_array_header_1_0(f)
            self.counts.append(shape[0])
        self.ends = np.cumsum(self.counts)
        self.maps = None

    def __len__(self):
        return int(self.ends[-1])

    def __getitem__(self, i):
        if self.maps is None:
            self.maps = [np.load(p, mmap_mode="r") for p in self.paths]
        f = int(np.searchsorted(self.ends, i, side="right"))
        return self.maps[f][i - (self.ends[f - 1] if f else 0)]


def to_sample(row):
    """input_ids / labels (int64 tensors) of one stored sample of seq+1 tokens."""
    import torch

    x = torch.from_numpy(np.asarray(row, dtype=np.int64))
    return {"input_ids": x[:-1], "labels": x[1:]}
