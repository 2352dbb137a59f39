"""Random row batches at cloud latency: faultmap against obstore and fsspec, in one run.

The workload of a training loop's sampler: --batches batches of --rows
random rows of 4 KiB each (fixed seed, the same rows for every engine),
from one S3 object of --size bytes (a fixed pseudo-random pattern) on the
project's versitygw, through ``faultmap proxy --latency-ms 20``: the
counting proxy of ``faultmap bench --remote``, adding a cloud object
store's first-byte latency to every response. Every client's endpoint is
the proxy's URL (an S3 client signs for the host it talks to).

Engines, each with a fresh client or mapping per repetition (cold), timed
from its open:

- ``faultmap``: ``faultmap.Pager().open("s3://bucket/key")`` with the
  defaults; per batch ``m.prefetch_ranges(starts, lengths, wait=True)``
  (the batch's rows read at once, in few requests all in flight), then
  ``a[idx]`` on ``numpy.frombuffer(m, numpy.uint8).reshape(-1, 4096)``;
- ``faultmap-no-prefetch``: the same gather without the prefetch: each
  row's fault waits for its own read, one after another (the baseline of
  the 5x target);
- ``obstore``: ``obstore.get_ranges(S3Store(...), key, starts=, lengths=)``
  per batch (ranges closer than 1 MiB merged, 10 requests at a time), the
  buffers copied into one numpy array;
- ``fsspec``: s3fs's ``fs.cat_ranges([path] * n, starts, ends)`` per batch
  (concurrent, on aiobotocore's pool of 10 connections), likewise.

The rows each engine returns are checksummed (CRC-32 of the gathered
``(rows, 4096)`` array, chained over the batches) against the object's
backing file read with ``numpy.memmap``: a mismatch ends the run with an
error. One proxy runs per engine and repetition, so its counters (printed
when it exits) are that run's requests and body bytes, the open included.

Reports per engine the median time per batch (over all batches of all
repetitions), the median open time, the median total (open + batches) and
the proxy's requests and bytes per run, then the ratios the targets are
about: faultmap-no-prefetch / faultmap (target >= 5), obstore / faultmap
(target >= 1.2) and fsspec / faultmap, of the per-batch medians. Writes
``{"machine": ..., "results": [...], "ratios": {...}}`` to --json.

Run it with ``python/bench/run-batch``, which installs what it needs into
.venv, builds the ``faultmap`` command and starts and stops the servers.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy

import faultmap
from bench import parse_size  # python/bench/bench.py, beside this file

ROW = 4096
REPO = Path(__file__).resolve().parents[2]
ENGINES = ["faultmap", "faultmap-no-prefetch", "obstore", "fsspec"]
# The targets of the ratios, engine over faultmap (per-batch medians).
TARGETS = {"faultmap-no-prefetch": 5.0, "obstore": 1.2, "fsspec": None}
# How long the proxy may take to print its URL, and to exit once told.
PROXY_TIMEOUT_SECS = 10


def write_object(path: Path, size: int, seed: int) -> None:
    """size bytes of a fixed pseudo-random pattern, in 64 MiB pieces."""
    rng = numpy.random.default_rng(seed)
    left = size
    with open(path, "wb") as f:
        while left:
            n = min(left, 64 << 20)
            f.write(rng.bytes(n))
            left -= n


class ProxyProcess:
    """``faultmap proxy`` in a child process: started with a pipe on its
    stdin, which is its lease; ``close()`` ends the pipe and returns the
    counters it printed on stderr. If this process dies, the pipe closes
    and the proxy exits by itself."""

    def __init__(self, binary: str, upstream: str, latency_ms: int):
        self.proc = subprocess.Popen(
            [binary, "proxy", "--upstream", upstream, "--latency-ms", str(latency_ms)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=PROXY_TIMEOUT_SECS)
            raise SystemExit(f"faultmap proxy did not start: {err.strip() or 'no output'}")

    def close(self) -> dict:
        """Stops the proxy; returns its counters (requests, body_bytes, ...)."""
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=PROXY_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise SystemExit("faultmap proxy did not exit when its stdin closed")
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        line = next((l for l in err.splitlines() if l.startswith("faultmap proxy:")), None)
        if self.proc.returncode != 0 or line is None:
            raise SystemExit(f"faultmap proxy failed (exit {self.proc.returncode}): {err.strip()}")
        return {k: int(v) for k, v in
                (w.split("=", 1) for w in line.split() if "=" in w and w.split("=", 1)[1].isdigit())}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def check_rows(name: str, parts, lengths) -> None:
    """Every part must be a bytes-like of its range's length (s3fs's
    cat_ranges returns an exception in place of a failed range)."""
    for k, (part, n) in enumerate(zip(parts, lengths)):
        if isinstance(part, BaseException):
            raise SystemExit(f"{name}: range {k} failed: {part!r}")
        if len(memoryview(part)) != n:
            raise SystemExit(f"{name}: range {k} has {len(memoryview(part))} bytes, not {n}")


def stack(parts) -> numpy.ndarray:
    """The rows as one (n, ROW) uint8 array (a copy, as a collate makes)."""
    rows = numpy.empty((len(parts), ROW), dtype=numpy.uint8)
    for k, part in enumerate(parts):
        rows[k] = numpy.frombuffer(part, dtype=numpy.uint8)
    return rows


class Engine:
    """One way to read the batches. ``open`` returns a session (timed),
    ``batch`` the rows of one batch as an (n, ROW) uint8 array (timed),
    ``close`` ends the session (not timed)."""

    name = ""

    def prepare(self):
        """Before the run's timing starts."""

    def open(self, s3, proxy_url):
        raise NotImplementedError

    def batch(self, session, idx, starts, lengths):
        raise NotImplementedError

    def close(self, session):
        pass

    def extra(self, session):
        """Engine counters of the run, for the JSON."""
        return {}


class FaultMap(Engine):
    """faultmap's mapping of the object; with ``prefetch``, each batch's
    rows read first with ``prefetch_ranges(..., wait=True)``."""

    def __init__(self, prefetch: bool):
        self.prefetch = prefetch
        self.name = "faultmap" if prefetch else "faultmap-no-prefetch"

    def open(self, s3, proxy_url):
        # The S3 store reads its endpoint from the environment at open;
        # main() has pointed AWS_ENDPOINT_URL at this run's proxy.
        assert os.environ["AWS_ENDPOINT_URL"] == proxy_url
        session = {"pager": self.pager, "prefetch_requests": 0}
        session["m"] = m = self.pager.open(s3["url"])
        session["a"] = numpy.frombuffer(m, dtype=numpy.uint8).reshape(-1, ROW)
        return session

    def prepare(self):
        """A new pager per run, its threads started outside the timing."""
        self.pager = faultmap.Pager()

    def batch(self, session, idx, starts, lengths):
        if self.prefetch:
            got = session["m"].prefetch_ranges(starts, lengths, wait=True)
            session["prefetch_requests"] += got["requests"]
        return session["a"][idx]

    def close(self, session):
        m = session["m"]
        session["stats"] = {k: v for k, v in m.stats().items()
                            if k in ("pgfault", "pgmajfault", "io_count", "io_bytes")}
        del session["a"]
        m.close()
        session.pop("m")
        session.pop("pager")
        self.pager = None

    def extra(self, session):
        out = dict(session["stats"])
        if self.prefetch:
            out["prefetch_requests"] = session["prefetch_requests"]
        return out


class Obstore(Engine):
    name = "obstore"

    def prepare(self):
        """The import, outside the timing."""
        import obstore
        import obstore.store

        self.obstore = obstore

    def open(self, s3, proxy_url):
        store = self.obstore.store.S3Store(
            s3["bucket"], endpoint=proxy_url, access_key_id=s3["key_id"],
            secret_access_key=s3["secret"], region=s3["region"],
            virtual_hosted_style_request=False, client_options={"allow_http": True},
        )
        return {"store": store, "key": s3["key"]}

    def batch(self, session, idx, starts, lengths):
        parts = self.obstore.get_ranges(session["store"], session["key"],
                                   starts=starts.tolist(), lengths=lengths.tolist())
        check_rows(self.name, parts, lengths)
        return stack(parts)


class Fsspec(Engine):
    name = "fsspec"

    def prepare(self):
        """The import, outside the timing."""
        import s3fs

        self.s3fs = s3fs

    def open(self, s3, proxy_url):
        fs = self.s3fs.S3FileSystem(
            endpoint_url=proxy_url, key=s3["key_id"], secret=s3["secret"],
            client_kwargs={"region_name": s3["region"]}, skip_instance_cache=True,
        )
        return {"fs": fs, "path": f"{s3['bucket']}/{s3['key']}"}

    def batch(self, session, idx, starts, lengths):
        n = len(starts)
        parts = session["fs"].cat_ranges([session["path"]] * n, starts.tolist(),
                                         (starts + lengths).tolist())
        check_rows(self.name, parts, lengths)
        return stack(parts)


def make_engine(name: str) -> Engine:
    return {
        "faultmap": lambda: FaultMap(prefetch=True),
        "faultmap-no-prefetch": lambda: FaultMap(prefetch=False),
        "obstore": Obstore,
        "fsspec": Fsspec,
    }[name]()


def run_once(engine, s3, batches, binary, latency_ms):
    """One cold run of `engine` over every batch through a proxy of its
    own: (open seconds, per-batch seconds, checksum, proxy counters, extra)."""
    engine.prepare()
    proxy = ProxyProcess(binary, s3["endpoint"], latency_ms)
    saved = os.environ["AWS_ENDPOINT_URL"]
    os.environ["AWS_ENDPOINT_URL"] = proxy.url
    try:
        t = time.perf_counter()
        session = engine.open(s3, proxy.url)
        open_seconds = time.perf_counter() - t
        crc, seconds = 0, []
        lengths = numpy.full(batches.shape[1], ROW, dtype=numpy.int64)
        for idx in batches:
            starts = idx * ROW
            t = time.perf_counter()
            rows = engine.batch(session, idx, starts, lengths)
            seconds.append(time.perf_counter() - t)
            if rows.shape != (len(idx), ROW) or rows.dtype != numpy.uint8:
                raise SystemExit(f"{engine.name}: rows of shape {rows.shape} {rows.dtype}")
            crc = zlib.crc32(numpy.ascontiguousarray(rows), crc)
        engine.close(session)
        extra = engine.extra(session)
    except BaseException:
        proxy.kill()
        raise
    finally:
        os.environ["AWS_ENDPOINT_URL"] = saved
    stats = proxy.close()
    return open_seconds, seconds, crc, stats, extra


def reference_crc(path: Path, batches) -> int:
    """The checksum every engine must match, from the object's backing file."""
    a = numpy.memmap(path, dtype=numpy.uint8, mode="r").reshape(-1, ROW)
    crc = 0
    for idx in batches:
        crc = zlib.crc32(numpy.ascontiguousarray(a[idx]), crc)
    del a
    return crc


def s3_environment() -> dict:
    need = ["AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "FAULTMAP_S3_BUCKET", "FAULTMAP_S3_ROOT"]
    missing = [k for k in need if not os.environ.get(k)]
    if missing:
        raise SystemExit(f"not set: {', '.join(missing)}; run this through python/bench/run-batch "
                         "(or eval \"$(scripts/remote-servers up)\" first)")
    return {
        "endpoint": os.environ["AWS_ENDPOINT_URL"],
        "key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
        "region": os.environ.get("AWS_REGION", "us-east-1"),
        "bucket": os.environ["FAULTMAP_S3_BUCKET"],
        "root": Path(os.environ["FAULTMAP_S3_ROOT"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1G", help="object bytes (default 1G)")
    ap.add_argument("--rows", type=int, default=64, help="rows per batch (default 64)")
    ap.add_argument("--batches", type=int, default=10, help="batches per run (default 10)")
    ap.add_argument("-r", "--repetitions", type=int, default=3,
                    help="cold runs per engine (default 3)")
    ap.add_argument("--latency-ms", type=int, default=20,
                    help="first-byte latency the proxy adds (default 20)")
    ap.add_argument("--seed", type=int, default=20261129, help="of the rows and the pattern")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help=f"comma-separated, of {','.join(ENGINES)} (default all)")
    ap.add_argument("--faultmap", default=os.environ.get(
        "FAULTMAP_BIN", str(REPO / "target" / "release" / "faultmap")),
        help="the faultmap command (default $FAULTMAP_BIN or target/release/faultmap)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    size = parse_size(args.size)
    if size < ROW or size % ROW:
        ap.error(f"--size must be a positive multiple of {ROW}")
    if min(args.rows, args.batches, args.repetitions) < 1 or not 0 <= args.latency_ms <= 10_000:
        ap.error("--rows, --batches and --repetitions must be at least 1, "
                 "--latency-ms within 0..=10000")
    names = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not names or any(e not in ENGINES for e in names):
        ap.error(f"--engines: of {','.join(ENGINES)}")
    if not os.access(args.faultmap, os.X_OK):
        ap.error(f"{args.faultmap} is not executable: cargo build --release -p faultmap-cli")

    s3 = s3_environment()
    s3["key"] = f"pybatch-{os.getpid()}.bin"
    s3["url"] = f"s3://{s3['bucket']}/{s3['key']}"
    object_path = s3["root"] / s3["key"]
    nrows = size // ROW
    batches = numpy.random.default_rng(args.seed).integers(
        0, nrows, size=(args.batches, args.rows), dtype=numpy.int64)
    engines = [make_engine(n) for n in names]
    runs = {e.name: [] for e in engines}

    print(f"writing a {size >> 20} MiB object to {object_path} ...", file=sys.stderr, flush=True)
    try:
        write_object(object_path, size, args.seed)
        want = reference_crc(object_path, batches)
        # Repetitions outermost: each engine's runs spread over the whole
        # run, so a slow phase of the machine hits every engine alike.
        for rep in range(args.repetitions):
            for engine in engines:
                print(f"  {engine.name} #{rep + 1}", file=sys.stderr, flush=True)
                open_s, seconds, crc, stats, extra = run_once(
                    engine, s3, batches, args.faultmap, args.latency_ms)
                if crc != want:
                    raise SystemExit(f"{engine.name} read wrong bytes: checksum {crc:#010x}, "
                                     f"the object's rows have {want:#010x}")
                runs[engine.name].append({"open_seconds": open_s, "batch_seconds": seconds,
                                          "proxy": stats, **extra})
    finally:
        object_path.unlink(missing_ok=True)

    results = [summarize(name, rs) for name, rs in runs.items()]
    ratios = ratios_of(results)
    print_table(results, ratios, args, size)
    if args.json:
        machine = {
            "benchmark": "python-batch",
            "python": platform.python_version(),
            "numpy": numpy.__version__,
            "faultmap": faultmap.__version__,
            "versions": versions(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "object_bytes": size,
            "rows": args.rows,
            "row_bytes": ROW,
            "batches": args.batches,
            "repetitions": args.repetitions,
            "latency_ms": args.latency_ms,
            "seed": args.seed,
            "checksum": want,
        }
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "results": results, "ratios": ratios}, f, indent=4)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def summarize(name, rs):
    every_batch = [s for r in rs for s in r["batch_seconds"]]
    totals = [r["open_seconds"] + sum(r["batch_seconds"]) for r in rs]
    per_run = lambda key: statistics.median(r["proxy"].get(key, 0) for r in rs)
    out = {
        "engine": name,
        "batch_seconds": statistics.median(every_batch),
        "batch_seconds_min": min(every_batch),
        "batch_seconds_max": max(every_batch),
        "open_seconds": statistics.median(r["open_seconds"] for r in rs),
        "total_seconds": statistics.median(totals),
        "total_seconds_all": totals,
        "requests": per_run("requests"),
        "body_bytes": per_run("body_bytes"),
        "runs": rs,
    }
    return out


def ratios_of(results):
    """Each engine's per-batch and total medians over faultmap's."""
    by = {r["engine"]: r for r in results}
    base = by.get("faultmap")
    out = {}
    if not base:
        return out
    for name, target in TARGETS.items():
        if name in by:
            out[f"{name}/faultmap"] = {
                "batch": by[name]["batch_seconds"] / base["batch_seconds"],
                "total": by[name]["total_seconds"] / base["total_seconds"],
                "target": target,
            }
    return out


def print_table(results, ratios, args, size):
    print(f"\n{args.batches} batches of {args.rows} random 4 KiB rows from a {size >> 20} MiB "
          f"S3 object (versitygw), +{args.latency_ms} ms first-byte latency "
          f"(cold runs, medians of {args.repetitions})")
    head = (f"{'engine':<22}{'batch ms':>10}{'open ms':>9}{'total s':>9}"
            f"{'requests':>10}{'MiB':>8}{'vs faultmap':>13}")
    print(head)
    print("-" * len(head))
    base = next((r["batch_seconds"] for r in results if r["engine"] == "faultmap"), None)
    for r in results:
        vs = f"{r['batch_seconds'] / base:>12.2f}x" if base else f"{'':>13}"
        print(f"{r['engine']:<22}{r['batch_seconds'] * 1e3:>10.1f}{r['open_seconds'] * 1e3:>9.1f}"
              f"{r['total_seconds']:>9.3f}{r['requests']:>10.0f}{r['body_bytes'] / 2**20:>8.1f}{vs}")
    print("(batch ms: median over every batch; requests, MiB: what the proxy forwarded per run, "
          "open included; vs faultmap: the engine's batch time over faultmap's)")
    for key, r in ratios.items():
        target = r["target"]
        verdict = "" if target is None else (
            f"  target >= {target:g}: {'met' if r['batch'] >= target else 'NOT met'}")
        print(f"{key}: {r['batch']:.2f}x per batch, {r['total']:.2f}x total{verdict}")


def versions():
    out = {}
    for mod in ("obstore", "fsspec", "s3fs"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # not installed, or no __version__
            out[mod] = None
    return out


if __name__ == "__main__":
    sys.exit(main())
