"""faultmap from Python against what Python users use today, in one run.

Two workloads over a float32 array of --size bytes (1 GiB by default) in
rows of 4 KiB (1024 floats):

- ``sum``: reduce the whole array (``a.sum()``);
- ``rows``: gather --rows random rows (``a[idx].sum()``).

Engines on a local file, each timed from its open: cold (the file's
pages dropped from the kernel's page cache with ``posix_fadvise(DONTNEED)``;
faultmap's own cache starts empty with each open) and warm (the file in the
page cache); and hot: the second computation over the same array (all of
it in memory and mapped), without the open:

- ``numpy.fromfile``: read the whole file into memory, then compute;
- ``numpy.memmap``: kernel mmap;
- ``faultmap``: ``faultmap.open(path).array(...)`` with its defaults
  (handler delivery, fault-around order 4), and ``faultmap-signal`` with
  ``delivery="signal"``; for ``sum`` also ``faultmap-o9``
  (``fault_around_order=9``), for ``rows`` ``faultmap+random`` (after
  ``m.advise("random")``).

With --s3 (the project's versitygw, from ``scripts/remote-servers``), the
same array as an S3 object:

- ``fsspec-s3fs``: ``fs.cat_file`` of the whole object for ``sum`` (into
  ``numpy.frombuffer``), ``fs.cat_ranges`` of the rows (s3fs issues them
  concurrently) for ``rows``;
- ``faultmap``, ``faultmap-signal`` and the variant on the s3:// URL.

Each cell is the median of --repetitions runs; ratios are taken inside this
run only. Prints a table per workload and writes JSON rows
(``{"machine": ..., "results": [...]}``, the shape of ``faultmap bench``'s)
to --json.

Run it with ``python/bench/run``, which installs what it needs into .venv
and starts and stops the servers.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy

import faultmap

ROW_FLOATS = 1024
ROW_BYTES = ROW_FLOATS * 4


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def make_file(path: str, size: int) -> None:
    """size bytes of float32 in [0, 1), written in 64 MiB pieces."""
    rng = numpy.random.default_rng(20261125)
    left = size // 4
    with open(path, "wb") as f:
        while left:
            n = min(left, 16 << 20)
            rng.random(n, dtype=numpy.float32).tofile(f)
            left -= n
        f.flush()
        os.fsync(f.fileno())  # clean pages: posix_fadvise can drop them


def drop_cache(path: str) -> None:
    """Drops the file's clean pages from the kernel's page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_cache(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def compute(workload: str, a: numpy.ndarray, idx: numpy.ndarray) -> float:
    if workload == "sum":
        return float(a.sum(dtype=numpy.float64))
    return float(a.reshape(-1, ROW_FLOATS)[idx].sum(dtype=numpy.float64))


class Engine:
    """One way to get the array: `run` returns (seconds, result, extra)."""

    name = ""

    def run(self, workload, idx, hot=False):
        """With `hot`, times a second computation over the same array."""
        raise NotImplementedError


class FromFile(Engine):
    name = "numpy.fromfile"

    def __init__(self, path):
        self.path = path

    def run(self, workload, idx, hot=False):
        t = time.perf_counter()
        a = numpy.fromfile(self.path, dtype=numpy.float32)
        r = compute(workload, a, idx)
        if hot:
            t = time.perf_counter()
            r = compute(workload, a, idx)
        return time.perf_counter() - t, r, {}


class MemMap(Engine):
    name = "numpy.memmap"

    def __init__(self, path):
        self.path = path

    def run(self, workload, idx, hot=False):
        t = time.perf_counter()
        a = numpy.memmap(self.path, dtype=numpy.float32, mode="r")
        r = compute(workload, a, idx)
        if hot:
            t = time.perf_counter()
            r = compute(workload, a, idx)
        seconds = time.perf_counter() - t
        del a
        return seconds, r, {}


class FaultMap(Engine):
    def __init__(self, target, pager, name, advice=None, order=None):
        self.target, self.pager, self.name = target, pager, name
        self.advice, self.order = advice, order

    def run(self, workload, idx, hot=False):
        t = time.perf_counter()
        m = faultmap.open(self.target, pager=self.pager, fault_around_order=self.order)
        if self.advice:
            m.advise(self.advice)
        a = m.array(numpy.float32)
        r = compute(workload, a, idx)
        if hot:
            t = time.perf_counter()
            r = compute(workload, a, idx)
        seconds = time.perf_counter() - t
        stats = m.stats()
        del a
        m.close()
        extra = {k: stats[k] for k in ("pgfault", "pgmajfault", "io_count", "io_bytes")}
        return seconds, r, extra


class Fsspec(Engine):
    name = "fsspec-s3fs"

    def __init__(self, url, size):
        import s3fs

        self.fs = s3fs.S3FileSystem(
            endpoint_url=os.environ["AWS_ENDPOINT_URL"],
            key=os.environ["AWS_ACCESS_KEY_ID"],
            secret=os.environ["AWS_SECRET_ACCESS_KEY"],
            client_kwargs={"region_name": os.environ.get("AWS_REGION", "us-east-1")},
            skip_instance_cache=True,
        )
        self.path = url.removeprefix("s3://")
        self.size = size

    def run(self, workload, idx, hot=False):
        t = time.perf_counter()
        if workload == "sum":
            a = numpy.frombuffer(self.fs.cat_file(self.path), dtype=numpy.float32)
            r = compute(workload, a, numpy.empty(0, dtype=numpy.int64))
            extra = {"io_bytes": self.size}
        else:
            starts = [int(i) * ROW_BYTES for i in idx]
            ends = [s + ROW_BYTES for s in starts]
            parts = self.fs.cat_ranges([self.path] * len(idx), starts, ends)
            rows = numpy.frombuffer(b"".join(parts), dtype=numpy.float32)
            r = float(rows.sum(dtype=numpy.float64))
            extra = {"io_count": len(idx), "io_bytes": len(idx) * ROW_BYTES}
        return time.perf_counter() - t, r, extra


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1G", help="array bytes (default 1G)")
    ap.add_argument("--rows", type=int, default=4096, help="random rows gathered (default 4096)")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--file", help="a float32 file to use (default: generated)")
    ap.add_argument("--s3", action="store_true", help="also the s3:// engines (needs the servers)")
    ap.add_argument("--json", help="write the JSON rows here")
    args = ap.parse_args()
    size = parse_size(args.size)
    if size < ROW_BYTES or size % ROW_BYTES:
        ap.error(f"--size must be a positive multiple of {ROW_BYTES}")
    if args.repetitions < 1 or args.rows < 1:
        ap.error("--repetitions and --rows must be at least 1")

    scratch = tempfile.TemporaryDirectory(prefix="faultmap-pybench-")
    path = args.file or os.path.join(scratch.name, "array.f32")
    if args.file:
        size = os.path.getsize(path) // ROW_BYTES * ROW_BYTES
    else:
        print(f"generating {size >> 20} MiB of float32 ...", file=sys.stderr, flush=True)
        make_file(path, size)
    nrows = size // ROW_BYTES
    idx = numpy.random.default_rng(7).integers(0, nrows, args.rows)

    handler = faultmap.Pager()
    signal = faultmap.Pager(delivery="signal")
    local = [
        FromFile(path),
        MemMap(path),
        FaultMap(path, handler, "faultmap"),
        FaultMap(path, signal, "faultmap-signal"),
    ]
    results = []
    expected = {}

    def measure(engine, store, workload, state, prepare):
        seconds_all, extra, value = [], {}, None
        for rep in range(args.repetitions):
            prepare()
            print(f"  {store} {workload} {state} {engine.name} #{rep + 1}", file=sys.stderr, flush=True)
            seconds, value, extra = engine.run(workload, idx, hot=state == "hot")
            seconds_all.append(seconds)
        want = expected.setdefault(workload, value)
        if not numpy.isclose(value, want, rtol=1e-6):
            raise SystemExit(f"{engine.name} computed {value}, not {want}: wrong bytes")
        med = statistics.median(seconds_all)
        data_bytes = size if workload == "sum" else args.rows * ROW_BYTES
        results.append({
            "workload": workload, "store": store, "state": state, "engine": engine.name,
            "seconds": med, "repetitions": args.repetitions,
            "seconds_min": min(seconds_all), "seconds_max": max(seconds_all),
            "seconds_all": seconds_all, "bytes": data_bytes,
            "bytes_per_second": data_bytes / med if med else None,
            "rows": args.rows if workload == "rows" else None, **extra,
        })

    def variants(target, workload):
        """faultmap's variants beyond the default: 2 MiB fault-around for
        the scan, MADV_RANDOM for the gather."""
        if workload == "sum":
            return [FaultMap(target, handler, "faultmap-o9", order=9)]
        return [FaultMap(target, handler, "faultmap+random", advice="random")]

    for workload in ["sum", "rows"]:
        engines = local + variants(path, workload)
        states = [
            ("cold", lambda: drop_cache(path)),
            ("warm", lambda: warm_cache(path)),
            ("hot", lambda: warm_cache(path)),
        ]
        for state, prepare in states:
            for engine in engines:
                measure(engine, "file", workload, state, prepare)

    if args.s3:
        root = os.environ["FAULTMAP_S3_ROOT"]
        bucket = os.environ["FAULTMAP_S3_BUCKET"]
        name = f"pybench-{os.getpid()}.f32"
        object_path = os.path.join(root, name)
        with open(path, "rb") as src, open(object_path, "wb") as dst:
            while chunk := src.read(64 << 20):
                dst.write(chunk)
        url = f"s3://{bucket}/{name}"
        try:
            for workload in ["sum", "rows"]:
                engines = [
                    Fsspec(url, size),
                    FaultMap(url, handler, "faultmap"),
                    FaultMap(url, signal, "faultmap-signal"),
                ] + variants(url, workload)
                for engine in engines:
                    # The server's disk cache warm for every engine alike.
                    measure(engine, "s3", workload, "cold", lambda: warm_cache(object_path))
        finally:
            os.unlink(object_path)

    print_tables(results, size, args.rows)
    if args.json:
        machine = {
            "benchmark": "python",
            "python": platform.python_version(),
            "numpy": numpy.__version__,
            "faultmap": faultmap.__version__,
            "cpus": os.cpu_count(),
            "file_bytes": size,
            "rows": args.rows,
            "row_bytes": ROW_BYTES,
            "repetitions": args.repetitions,
            "kernel": platform.release(),
        }
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "results": results}, f, indent=4)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def print_tables(results, size, rows):
    for (store, workload) in dict.fromkeys((r["store"], r["workload"]) for r in results):
        cells = [r for r in results if r["store"] == store and r["workload"] == workload]
        what = f"sum of {size >> 20} MiB" if workload == "sum" else f"{rows} random 4 KiB rows"
        print(f"\n{store}: {what} (median of {cells[0]['repetitions']})")
        states = list(dict.fromkeys(r["state"] for r in cells))
        base = {s: next((r["seconds"] for r in cells if r["state"] == s and r["engine"] in
                         ("numpy.memmap", "fsspec-s3fs")), None) for s in states}
        head = f"{'engine':<18}" + "".join(f"{s + ' s':>11}{'vs ref':>9}" for s in states)
        print(head)
        print("-" * len(head))
        for engine in dict.fromkeys(r["engine"] for r in cells):
            line = f"{engine:<18}"
            for s in states:
                r = next((r for r in cells if r["engine"] == engine and r["state"] == s), None)
                if r is None:
                    line += f"{'':>20}"
                    continue
                ratio = base[s] / r["seconds"] if base[s] else float("nan")
                line += f"{r['seconds']:>11.3f}{ratio:>8.2f}x"
            print(line)
        ref = "numpy.memmap" if store == "file" else "fsspec-s3fs"
        print(f"(vs ref: {ref}'s time over the engine's; above 1 is faster)")


if __name__ == "__main__":
    sys.exit(main())
