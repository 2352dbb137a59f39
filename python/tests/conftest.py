"""Fixtures for faultmap's Python tests: data files, the project's servers."""

import fcntl
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy
import pytest


def pattern(n: int, seed: int) -> bytes:
    """n bytes that differ at every offset (a page read at the wrong place
    would not match)."""
    rng = numpy.random.default_rng(seed)
    return rng.integers(0, 256, n, dtype=numpy.uint8).tobytes()


@pytest.fixture
def data_file(tmp_path: pathlib.Path):
    """A 50 MB file that ends mid-page, and its bytes."""
    data = pattern(50_000_000 + 1234, 7)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return path, data


@pytest.fixture
def small_file(tmp_path: pathlib.Path):
    """A 3 MiB + 100 byte file, and its bytes."""
    data = pattern(3 * 1024 * 1024 + 100, 11)
    path = tmp_path / "small.bin"
    path.write_bytes(data)
    return path, data


NR_HUGEPAGES = pathlib.Path("/proc/sys/vm/nr_hugepages")
FREE_HUGEPAGES = pathlib.Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
HUGE = 2 * 1024 * 1024


POOL_LOCK = pathlib.Path("/tmp/faultmap-hugepages.lock")


@pytest.fixture
def huge_pages():
    """grow(extra): grows the kernel's pool of 2 MiB pages by `extra`
    pages, through /proc/sys/vm/nr_hugepages (as root, which CI is), and
    takes as many out again when the test ends. It holds the lock file
    that every suite of the project and `faultmap bench` take to change
    the pool, from the first grow to the end of the test, so that no other
    process changes the pool meanwhile. A machine where the pool cannot be
    grown fails the test, loudly: it is not skipped."""
    lock = None
    added = 0

    def grow(extra: int) -> None:
        nonlocal lock, added
        if lock is None:
            # Read-only if it exists (flock needs no more, and a file
            # another user made stays usable), else made.
            try:
                lock = open(POOL_LOCK, "r")
            except FileNotFoundError:
                lock = open(POOL_LOCK, "a")
            fcntl.flock(lock, fcntl.LOCK_EX)
        old = int(NR_HUGEPAGES.read_text())
        try:
            NR_HUGEPAGES.write_text(f"{old + extra}\n")
        except OSError as e:
            pytest.fail(f"cannot grow the pool of huge pages ({NR_HUGEPAGES}: {e}); "
                        "these tests need root")
        now = int(NR_HUGEPAGES.read_text())
        added += max(0, now - old)
        if now < old + extra:
            pytest.fail(f"the kernel gave {now} huge pages of {old + extra} asked")

    yield grow
    if added:
        now = int(NR_HUGEPAGES.read_text())
        NR_HUGEPAGES.write_text(f"{max(0, now - added)}\n")
    if lock is not None:
        lock.close()


def server_env(name: str) -> str:
    """A variable of the project's servers; a test that needs them fails
    (never skips) without them."""
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: these tests need the project's servers; run "
            "them under ./scripts/test-all, or eval \"$(scripts/remote-servers up)\" first"
        )
    return value


@pytest.fixture
def s3_object():
    """An object in the project's versitygw bucket (a file in its root),
    its s3:// URL and its bytes; removed afterwards."""
    root = pathlib.Path(server_env("FAULTMAP_S3_ROOT"))
    bucket = server_env("FAULTMAP_S3_BUCKET")
    name = f"py-{os.getpid()}-{id(root)}.bin"
    data = pattern(6 * 1024 * 1024 + 333, 13)
    (root / name).write_bytes(data)
    yield f"s3://{bucket}/{name}", data
    (root / name).unlink(missing_ok=True)


def run_python(code: str, env=None, timeout=120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for what ends a process: fork,
    SIGBUS), bounded by `timeout` seconds."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


# An HTTP server of the test's own, on 127.0.0.1, for failures the
# project's nginx cannot produce on demand: ranged GETs of `data`, those
# from byte `fail_from` on answered with 500 once `fail` is set (the open's
# own requests, at byte 0, still work), and without an ETag once
# `validators` is cleared (it never sends a Last-Modified); `sent` counts
# the bytes of the bodies it sent. Used in-process and (as source text) in
# child interpreters.
FAILING_SERVER = '''
import http.server, threading

_SENT_LOCK = threading.Lock()

class FailingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, data):
        self.data, self.fail, self.fail_from = data, False, 4096
        self.validators = True
        self.hold = threading.Event()  # cleared: GETs wait until it is set
        self.hold.set()
        self.held = 0  # GETs that waited for `hold`
        self.sent = 0  # body bytes of ranged GETs, in total
        self.gets = 0  # GETs received
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_port}/object.bin"

class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _head(self, status, length, extra=()):
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        if self.server.validators:
            self.send_header("ETag", '"v1"')
        self.send_header("Accept-Ranges", "bytes")
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()

    def do_HEAD(self):
        self._head(200, len(self.server.data))

    def do_GET(self):
        data, server = self.server.data, self.server
        with _SENT_LOCK:
            server.gets += 1
        if not server.hold.is_set():
            with _SENT_LOCK:
                server.held += 1
            server.hold.wait(60)
        first, last = 0, len(data) - 1
        if "Range" in self.headers:
            first, last = self.headers["Range"].split("=")[1].split("-")
            first, last = int(first), min(int(last or len(data) - 1), len(data) - 1)
        if server.fail and first >= server.fail_from:
            self._head(500, 0)
            return
        body = data[first:last + 1]
        self._head(206, len(body), [("Content-Range", f"bytes {first}-{last}/{len(data)}")])
        self.wfile.write(body)
        with _SENT_LOCK:
            server.sent += len(body)
'''

exec(FAILING_SERVER)


@pytest.fixture
def failing_server():
    """A FailingServer over 1 MiB of pattern bytes; shut down afterwards."""
    server = FailingServer(pattern(1 << 20, 17))  # noqa: F821 (defined by exec)
    yield server
    server.shutdown()
    server.server_close()


def protect_engine() -> bool:
    """Whether this process's pagers run the protect engine (no
    userfaultfd here: a container's seccomp profile, scripts/nouffd, or
    FAULTMAP_ENGINE=protect)."""
    import faultmap

    return faultmap.Pager().engine == "protect"


