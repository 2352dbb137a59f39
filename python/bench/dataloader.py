"""The DataLoader pattern: a dataset opened in ``__init__``, read by fork workers.

A dataset of rows of 4 KiB (1024 float32) in one S3 object (the project's
versitygw). ``__init__`` opens it; ``__getitem__(i)`` returns row ``i`` as
a numpy array (a copy, as a collate makes). The loader forks --workers
processes with multiprocessing's fork context, as
``torch.utils.data.DataLoader`` does on Linux (the dataset is inherited,
not pickled), and the workers share --batches batches of --batch-size
indices from a shuffled sampler: one epoch reads every row once
(``--epoch``, the default) or random rows (``--random``). Each worker sums
its rows; the sums must agree across engines.

Engines, each on a cold cache:

- ``faultmap-shared``: ``faultmap.open(url)`` in ``__init__``; the workers
  read the mapping they inherited, served from the parent's one cache;
- ``faultmap-per-worker``: each worker opens the object itself (a
  ``worker_init_fn``), one cache per worker;
- ``fsspec-s3fs``: each worker fetches its batch's rows with
  ``fs.cat_ranges``.

Reports the epoch's time and the bytes fetched from the store (faultmap's
``io_bytes``, summed over the caches; for s3fs the ranges it asked for).
Run it with ``python/bench/run-dataloader``, which installs what it needs
and starts and stops the servers.
"""

import argparse
import multiprocessing
import os
import statistics
import sys
import time

import numpy

import faultmap

ROW = 4096


class Dataset:
    """Rows of 4 KiB of one object, opened in ``__init__`` (``shared``) or
    in each worker."""

    def __init__(self, url, rows, engine):
        self.url, self.rows, self.engine = url, rows, engine
        self.pager = self.m = self.fs = None
        if engine == "faultmap-shared":
            self.pager = faultmap.Pager()
            self.m = self.pager.open(url)

    def worker_init(self):
        if self.engine == "faultmap-per-worker":
            self.pager = faultmap.Pager()
            self.m = self.pager.open(self.url)
        elif self.engine == "fsspec-s3fs":
            import s3fs

            self.fs = s3fs.S3FileSystem(
                key=os.environ["AWS_ACCESS_KEY_ID"],
                secret=os.environ["AWS_SECRET_ACCESS_KEY"],
                client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]},
            )

    def batch(self, idx):
        if self.fs is not None:
            path = self.url.removeprefix("s3://")
            parts = self.fs.cat_ranges(
                [path] * len(idx), [i * ROW for i in idx], [(i + 1) * ROW for i in idx]
            )
            return [numpy.frombuffer(p, numpy.float32) for p in parts]
        return [numpy.frombuffer(self.m[i * ROW:(i + 1) * ROW], numpy.float32) for i in idx]

    def fetched(self):
        # The pager's counters: a shared cache's include what it read for
        # the workers.
        return self.pager.stats()["io_bytes"] if self.pager is not None else 0


DATASET = None


def work(batches):
    global DATASET
    if not getattr(DATASET, "_started", False):
        DATASET.worker_init()
        DATASET._started = True
    total = 0.0
    for idx in batches:
        total += float(sum(row.sum(dtype=numpy.float64) for row in DATASET.batch(idx)))
    asked = sum(len(b) for b in batches) * ROW
    # A shared mapping's counters are the parent's (read there).
    mine = DATASET.fetched() if DATASET.engine == "faultmap-per-worker" else 0
    return total, mine, asked


def epoch(url, rows, engine, workers, batches):
    global DATASET
    DATASET = Dataset(url, rows, engine)  # in the parent, before the fork
    start = time.perf_counter()
    shares = [batches[w::workers] for w in range(workers)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        results = pool.map(work, shares, chunksize=1)
    seconds = time.perf_counter() - start
    total = sum(r[0] for r in results)
    if engine == "faultmap-shared":
        fetched = DATASET.fetched()
    elif engine == "fsspec-s3fs":
        fetched = sum(r[2] for r in results)
    else:
        fetched = sum(r[1] for r in results)
    if DATASET.m is not None:
        DATASET.m.close()
    DATASET = None
    return seconds, fetched, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=256, help="object MiB (default 256)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--random", type=int, metavar="N", help="N random rows instead of an epoch")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--engines", default="faultmap-shared,faultmap-per-worker,fsspec-s3fs")
    a = ap.parse_args()
    bucket, root = os.environ["FAULTMAP_S3_BUCKET"], os.environ["FAULTMAP_S3_ROOT"]
    rows = a.size * 1024 * 1024 // ROW
    name = f"dataloader-{a.size}m.bin"
    path = os.path.join(root, name)
    if not os.path.exists(path) or os.path.getsize(path) != rows * ROW:
        rng = numpy.random.default_rng(7)
        with open(path, "wb") as f:
            for _ in range(rows // 1024):
                f.write(rng.random(1024 * 1024, dtype=numpy.float32).tobytes())
    url = f"s3://{bucket}/{name}"
    rng = numpy.random.default_rng(11)
    order = rng.permutation(rows) if a.random is None else rng.integers(0, rows, a.random)
    batches = [order[i:i + a.batch_size].tolist() for i in range(0, len(order), a.batch_size)]
    what = "epoch" if a.random is None else f"{a.random} random rows"
    print(f"DataLoader pattern: {a.size} MiB object, {rows} rows of 4 KiB, {what}, "
          f"{len(batches)} batches of {a.batch_size}, {a.workers} fork workers, "
          f"median of {a.repetitions}")
    print(f"{'engine':<22}{'seconds':>10}{'MiB/s':>9}{'fetched':>12}{'x object':>10}")
    sums = {}
    for engine in a.engines.split(","):
        samples = [epoch(url, rows, engine, a.workers, batches) for _ in range(a.repetitions)]
        seconds = statistics.median(s[0] for s in samples)
        fetched = statistics.median(s[1] for s in samples)
        sums[engine] = samples[0][2]
        touched = len(order) * ROW
        print(f"{engine:<22}{seconds:>10.3f}{touched / seconds / 2**20:>9.0f}"
              f"{fetched / 2**20:>10.1f}Mi{fetched / (rows * ROW):>10.2f}")
    if len({round(s, 1) for s in sums.values()}) > 1:
        print(f"the engines read different bytes: {sums}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
