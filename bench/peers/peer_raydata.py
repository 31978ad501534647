#!/usr/bin/env python3
"""Ray Data in the peer table: Parquet written by Ray Data (``ray.data.from_numpy(...)
.write_parquet``), read by ``ray.data.read_parquet`` on a local Ray cluster started by
the harness (``ray.init(num_cpus=2)``, shut down at the end).

Ray Data has no weighted mixing of datasets, so the four sources are ``union``-ed: the
mixture is the sources' sizes (kernel_docs 0.44, python_src 0.18, man_i18n 0.33,
fortunes 0.05 of the samples), measured against the scheduled 0.4/0.3/0.2/0.1.  Shuffle:
``random_shuffle(seed)`` per epoch (Ray Data's "Shuffling data" page: the full global
shuffle; its cheaper ``randomize_block_order`` + local shuffle buffer does not mix sources
that are one block each: the first 100 steps were all kernel_docs), then
``iter_torch_batches(batch_size=2, prefetch_batches=4)``.  One pass over the union is an
epoch; the iterator starts the next one.  Ray Data iterators have no ``state_dict``.

Run: ``bench/peers/.venvs/raydata/bin/python bench/peers/peer_raydata.py MODE``.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

NO_DP = "no: no iterator state to resume from (see exact resume)"
NAME = "Ray Data"
NO_STATE = ("no state API: ray.data's DataIterator / iter_torch_batches has no state_dict "
            "or checkpoint of the position (the Ray Train docs resume from the epoch start)")


def data_dir(seq):
    return os.path.join(C.OUT, "parquet", str(seq))


def _init():
    import ray

    if not ray.is_initialized():
        # address="local": a new cluster of its own, never one another process started
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)


def prepare(seq):
    import numpy as np
    import ray

    d = data_dir(seq)
    if os.path.exists(os.path.join(d, "files2000.done")):
        return
    _init()
    samples = C.all_samples(seq)
    for name, s in zip(C.NAMES, samples):
        shutil.rmtree(os.path.join(d, name), ignore_errors=True)
        ray.data.from_numpy(s).repartition(1).write_parquet(os.path.join(d, name))
    shutil.rmtree(os.path.join(d, "files2000"), ignore_errors=True)
    ray.data.from_numpy(np.concatenate(samples)).repartition(2000).write_parquet(
        os.path.join(d, "files2000"))
    open(os.path.join(d, "files2000.done"), "w").close()
    ray.shutdown()


class Iter:
    def __init__(self, ds):
        self.ds = ds
        self.epoch = 0
        self.stop_at_epoch_end = False  # the throughput window ends at an epoch's end
        self.it = self._epoch()

    def _epoch(self):
        import torch

        def collate(b):
            x = torch.from_numpy(b["data"].astype("int64"))
            return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

        self.epoch += 1
        return iter(self.ds.random_shuffle(seed=C.SEED + self.epoch).iter_torch_batches(
            batch_size=C.MICRO_BATCH, prefetch_batches=4, collate_fn=collate, drop_last=True))

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.it)
        except StopIteration:
            if self.stop_at_epoch_end:
                raise
            self.it = self._epoch()
            return next(self.it)


def loader(seq, weights=C.WEIGHTS, files="4"):
    import ray

    _init()
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    d = data_dir(seq)
    if files == "4":
        parts = [ray.data.read_parquet(os.path.join(d, n)) for n in C.NAMES]
        ds = parts[0].union(*parts[1:])
    else:
        ds = ray.data.read_parquet(os.path.join(d, "kernel_docs" if files == "1" else "files2000"))
    return Iter(ds)


def _pss_files(n):
    d = C.pss_dir("parquet")
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    return [os.path.join(d, f) for f in names if f.endswith(".parquet")][:n]


def _pss_set(n):
    """A directory holding the first n sources' files (hard links)."""
    return C.pss_dir("parquet") + f"-{n}"


def pss_prepare(n):
    """The PSS column's sources: all PSS_MAX_SOURCES sources' samples written by Ray
    Data's ``write_parquet`` in as many blocks (``repartition`` keeps the order), one
    Parquet file per source (Ray names them by block index); the first n in a
    directory of their own (read_parquet of a list of files needs fsspec's HTTP
    filesystem, which fails to import in this venv: no aiohttp)."""
    import ray

    d = C.pss_dir("parquet")
    total = max(n, C.PSS_MAX_SOURCES)
    if len(_pss_files(total)) < total:
        _init()
        shutil.rmtree(d, ignore_errors=True)
        s = C.pss_samples(total)
        ray.data.from_numpy(s.reshape(-1, s.shape[-1])).repartition(total).write_parquet(d)
        ray.shutdown()
        assert len(_pss_files(total)) == total
        shutil.rmtree(_pss_set(n), ignore_errors=True)
    if not os.path.isdir(_pss_set(n)):
        os.makedirs(_pss_set(n) + ".tmp", exist_ok=True)
        for f in _pss_files(n):
            os.link(f, os.path.join(_pss_set(n) + ".tmp", os.path.basename(f)))
        os.rename(_pss_set(n) + ".tmp", _pss_set(n))


def pss_all(n, world):
    """The 8 ranks as Ray Train runs them: a local cluster started by this process, the
    one ``read_parquet`` of the n files, ``random_shuffle()``, ``streaming_split(world)``,
    one actor per rank iterating its split with ``iter_torch_batches(batch_size=2,
    prefetch_batches=4)``.  Returns (actors, checksum) once every rank has taken
    PSS_TAKE micro-batches; the actors keep their iterators until the process ends."""
    import ray

    _init()
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    print("pss: cluster up", flush=True, file=sys.stderr)
    # One read_parquet of a directory holding the n files (Ray Data cannot weight
    # sources anyway; with a list of files, or a union of per-file datasets, reading
    # needs fsspec's HTTP filesystem, whose import fails in this venv), shuffled per
    # epoch as in the table (random_shuffle).
    ds = ray.data.read_parquet(_pss_set(n)).random_shuffle(seed=C.SEED)
    splits = ds.streaming_split(world, equal=True)

    @ray.remote(num_cpus=0)
    class Rank:
        def __init__(self, split):
            import torch

            def collate(b):
                x = torch.from_numpy(b["data"].astype("int64"))
                return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

            self.it = iter(split.iter_torch_batches(batch_size=C.MICRO_BATCH,
                                                    prefetch_batches=4, collate_fn=collate))

        def take(self, k):
            t = 0
            for _ in range(k):
                b = next(self.it)
                t += int(b["input_ids"].sum()) + int(b["labels"].sum())
            return t

    actors = [Rank.remote(sp) for sp in splits]
    print("pss: splits and actors made", flush=True, file=sys.stderr)
    touched = sum(ray.get([a.take.remote(C.PSS_TAKE) for a in actors]))
    return actors, touched


def pss_close(_its):
    import ray

    ray.shutdown()


def close(it):
    import ray

    it.it = None
    ray.shutdown()


if __name__ == "__main__":
    C.main(sys.modules[__name__])
