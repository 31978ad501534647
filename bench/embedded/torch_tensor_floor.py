#!/usr/bin/env python3
"""The least a Python layer that hands out fresh torch tensors pays per micro-batch: five
zero-copy tensors (input_ids, labels, loss_mask, position_ids, cu_seqlens), each made by
``torch._C._from_dlpack`` from a DLPack capsule (the cheapest public way from foreign
memory to a torch.Tensor; ``torch.from_numpy`` and views such as ``t[:, :n]`` cost more),
plus the dict.  ``polyload.Loader.next_batch`` does exactly this in C
(``Loader.next_dict``), so this is the floor under its overhead against the C loader
(bench/embedded/python_overhead.py), whatever the rest costs.

Capsules are made before the clock (from NumPy arrays of a 1 x 8192 micro-batch), so the
figure is the tensors' and the dict's cost alone.  Medians of ``--repeats`` runs of
``--n`` micro-batches.

    .venv/bin/python bench/embedded/torch_tensor_floor.py [--n 100000] [--repeats 5]
"""
import argparse
import statistics
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cols", type=int, default=8192)
    a = ap.parse_args()
    fields = {"input_ids": np.zeros((1, a.cols), np.int64),
              "labels": np.zeros((1, a.cols), np.int64),
              "loss_mask": np.zeros((1, a.cols), np.float32),
              "position_ids": np.zeros((1, a.cols), np.int64),
              "cu_seqlens": np.zeros(9, np.int32)}
    from_dlpack = torch._C._from_dlpack
    per_tensor, per_mb, from_numpy = [], [], []
    for _ in range(a.repeats):
        caps = [fields["input_ids"].__dlpack__() for _ in range(a.n)]
        t0 = time.perf_counter()
        for c in caps:
            from_dlpack(c)
        per_tensor.append((time.perf_counter() - t0) / a.n * 1e6)
        caps = [{k: v.__dlpack__() for k, v in fields.items()} for _ in range(a.n // 5)]
        t0 = time.perf_counter()
        for c in caps:
            {k: from_dlpack(v) for k, v in c.items()}
        per_mb.append((time.perf_counter() - t0) / (a.n // 5) * 1e6)
        x = fields["input_ids"]
        t0 = time.perf_counter()
        for _ in range(a.n):
            torch.from_numpy(x)
        from_numpy.append((time.perf_counter() - t0) / a.n * 1e6)
    print(f"torch {torch.__version__}: torch._C._from_dlpack {statistics.median(per_tensor):.2f} us "
          f"per tensor; five tensors and their dict {statistics.median(per_mb):.2f} us per "
          f"micro-batch; torch.from_numpy {statistics.median(from_numpy):.2f} us "
          f"(medians of {a.repeats} x {a.n})")


if __name__ == "__main__":
    main()
