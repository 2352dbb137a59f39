"""faultmap's Python package, through real userfaultfd, real files and the
project's real servers."""

import errno
import gc
import mmap
import os
import pathlib
import signal
import socket
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import numpy
import pytest

import faultmap
from conftest import (
    FREE_HUGEPAGES,
    HUGE,
    FailingServer,
    pattern,
    protect_engine,
    run_python,
    server_env,
)


# ---------------------------------------------------------------------------
# Bytes.


def test_memoryview_crc_and_array_sum_equal_the_files(data_file):
    path, data = data_file
    with faultmap.open(path) as m:
        assert len(m) == len(data)
        assert zlib.crc32(memoryview(m)) == zlib.crc32(data)
        whole = len(data) // 4
        a = m.array(numpy.uint32, shape=whole)
        expected = numpy.fromfile(path, dtype=numpy.uint32, count=whole)
        assert a.sum(dtype=numpy.uint64) == expected.sum(dtype=numpy.uint64)
        assert m.stats()["pgfault"] > 0
        del a


def test_memoryview_is_zero_copy_and_read_only(small_file):
    path, data = small_file
    with faultmap.open(path) as m:
        view = memoryview(m)
        assert view.readonly and view.format == "B" and view.nbytes == len(data)
        assert view[12345] == data[12345]
        with pytest.raises(TypeError):
            view[0] = 1
        view.release()


@pytest.mark.parametrize(
    "key",
    [
        slice(None),
        slice(0, 10),
        slice(4090, 4200),
        slice(-100, None),
        slice(None, None, 4097),
        slice(None, None, -3),
        slice(100, 10, -7),
        slice(5, 5),
        slice(10**12, None),
    ],
)
def test_slices_are_the_files_bytes(small_file, key):
    path, data = small_file
    with faultmap.open(path) as m:
        got = m[key]
        assert isinstance(got, bytes)
        assert got == data[key]


def test_indexing_is_the_files_bytes(small_file):
    path, data = small_file
    with faultmap.open(path) as m:
        for i in [0, 1, 4095, 4096, len(data) - 1, -1, -len(data), numpy.int64(7)]:
            assert m[i] == data[i]
        with pytest.raises(IndexError):
            m[len(data)]
        with pytest.raises(IndexError):
            m[2**70]
        with pytest.raises(TypeError):
            m[1.0]

        class Odd:
            def __index__(self):
                raise KeyError("its own")

        with pytest.raises(KeyError):  # as bytes passes it on
            m[Odd()]
        with pytest.raises(IndexError):
            m[-len(data) - 1]
        with pytest.raises(TypeError):
            m["x"]


def test_offset_and_length_map_part_of_the_file(small_file):
    path, data = small_file
    with faultmap.open(path, offset=2 * 4096, length=10_000) as m:
        assert len(m) == 10_000
        assert bytes(memoryview(m)) == data[8192:18192]
    with faultmap.open(path, offset=4096) as m:
        assert m[:] == data[4096:]


@pytest.mark.parametrize(
    "dtype,shape,offset",
    [
        (numpy.uint8, None, 0),
        (numpy.int16, (1000, 3), 2),
        (numpy.float32, None, 4096),
        (numpy.float64, (64, 128), 8),
        (numpy.uint64, 5000, 3),  # unaligned: numpy copes
        (numpy.dtype(">i4"), (7, 11, 13), 100),
        (numpy.complex128, (10,), 0),
        (numpy.float32, (-1, 1024), 0),
        (numpy.uint16, (3, -1), 4096),
    ],
)
def test_array_matches_fromfile(small_file, dtype, shape, offset):
    path, data = small_file
    dtype = numpy.dtype(dtype)
    with faultmap.open(path) as m:
        a = m.array(dtype, shape=shape, offset=offset)
        fit = (len(data) - offset) // dtype.itemsize
        if shape is None:
            count = fit
        else:
            dims = (shape,) if isinstance(shape, int) else tuple(shape)
            known = abs(int(numpy.prod(dims)))
            count = fit // known * known if -1 in dims else known
        expected = numpy.fromfile(path, dtype=dtype, count=count, offset=offset)
        if shape is not None:
            expected = expected.reshape(shape)
        assert a.size == count
        assert a.shape == expected.shape
        assert a.dtype == dtype
        assert not a.flags.writeable
        # Random bytes make NaNs of floats: compare them as NaN-equal.
        assert numpy.array_equal(a, expected, equal_nan=dtype.kind in "fc")
        if dtype.kind in "iu":
            assert a.sum() == expected.sum()
        del a


def test_array_errors_are_numpys(small_file):
    path, _ = small_file
    with faultmap.open(path) as m:
        with pytest.raises(ValueError):
            m.array(numpy.uint64, shape=(len(m),))  # more than the mapping
        with pytest.raises(TypeError):
            m.array("not a dtype")
        with pytest.raises(ValueError):
            m.array(numpy.uint8, shape=(-1, -1))
        with pytest.raises(ValueError):
            m.array(numpy.uint8, shape=(-2, 4))
        with pytest.raises(TypeError):
            m.array(numpy.uint8, shape=("a", 4))
        with pytest.raises(ValueError):
            m.array(numpy.uint8, offset=len(m) + 1)


# ---------------------------------------------------------------------------
# Writes.


def test_writes_are_flushed_and_read_again(small_file):
    path, data = small_file
    with faultmap.open(path, writable=True) as m:
        assert m.writable
        view = memoryview(m)
        assert not view.readonly
        view[0:5] = b"HELLO"
        view[5000:5003] = b"abc"
        a = m.array(numpy.uint32, offset=8192, shape=4)
        assert a.flags.writeable
        a[:] = [1, 2, 3, 4]
        written = m.flush()
        assert written >= 2
        del a
        view.release()
        with open(path, "rb") as f:
            on_disk = f.read()
        assert on_disk[0:5] == b"HELLO"
        assert on_disk[5000:5003] == b"abc"
        assert numpy.frombuffer(on_disk, numpy.uint32, 4, 8192).tolist() == [1, 2, 3, 4]
        assert on_disk[10_000:] == data[10_000:]
        assert m[0:5] == b"HELLO"
        assert m.stats()["written_back"] >= 2


def test_close_writes_back(small_file):
    path, _ = small_file
    m = faultmap.open(path, writable=True)
    view = memoryview(m)
    view[-3:] = b"END"
    view.release()
    m.close()
    assert path.read_bytes()[-3:] == b"END"


def test_flush_checks_its_range_and_a_read_only_flush_writes_nothing(small_file):
    path, _ = small_file
    with faultmap.open(path) as m:
        assert m.flush() == 0
        with pytest.raises(ValueError):
            m.flush(0, len(m) + 1)
        with pytest.raises(ValueError):
            m.flush(10, 5)


# ---------------------------------------------------------------------------
# Threads, advice, the counters.


def test_threads_read_one_mapping(data_file):
    path, data = data_file
    m = faultmap.open(path)
    parts = 8
    step = len(data) // parts
    got = [None] * parts
    errors = []

    def read(k):
        try:
            end = len(data) if k == parts - 1 else (k + 1) * step
            view = memoryview(m)[k * step : end]
            got[k] = zlib.crc32(view)
            view.release()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    for k in range(parts):
        end = len(data) if k == parts - 1 else (k + 1) * step
        assert got[k] == zlib.crc32(data[k * step : end])
    gc.collect()
    m.close()


def test_advise_prefetch_invalidate(small_file):
    path, data = small_file
    with faultmap.open(path) as m:
        m.advise(mmap.MADV_SEQUENTIAL)
        m.advise("random", 0, 4096)
        m.prefetch()
        m.prefetch(4096, 8192)
        assert m[:] == data
        assert m.memory()["cached"] >= len(data)
        dropped = m.invalidate(0, 1 << 20)
        assert dropped == 256
        m.advise(mmap.MADV_DONTNEED)
        assert m[:] == data
        with pytest.raises(ValueError):
            m.advise("sideways")
        with pytest.raises(ValueError):
            m.advise(99)
        with pytest.raises(TypeError):
            m.advise(1.5)
        with pytest.raises(ValueError):
            m.prefetch(0, len(m) + 1)


def test_prefetch_ranges_reads_rows_given_as_pairs_or_arrays(small_file):
    path, data = small_file
    with faultmap.open(path, readahead="off") as m:
        rows = [(100, 50), (8192 + 7, 4096), (len(data) - 10, 10)]
        got = m.prefetch_ranges(rows, wait=True)
        # Pages 0, 2-3 and the last: three requests, four pages.
        assert got["requests"] == 3 and got["pages"] == 4, got
        starts = numpy.array([40960, 81920, 40961], dtype=numpy.int64)
        lengths = numpy.array([10, 4096, 5], dtype=numpy.uint32)
        got = m.prefetch_ranges(starts, lengths, wait=True)
        assert got["requests"] == 2, got
        majors = m.stats()["pgmajfault"]
        for start, length in [*rows, *zip(starts.tolist(), lengths.tolist())]:
            assert m[start:start + length] == data[start:start + length]
        assert m.stats()["pgmajfault"] == majors, "a prefetched row waited for a read"
        # Cached rows ask for nothing; touching ranges are one request.
        assert m.prefetch_ranges(starts, lengths)["requests"] == 0
        assert m.prefetch_ranges([(200000, 4096), (204800, 4096)])["requests"] == 1
        assert m.prefetch_ranges([])["requests"] == 0
        # Pairs as lists, or an (N, 2) array.
        pairs = numpy.array([[300000, 10], [400000, 4096]])
        assert m.prefetch_ranges(pairs, wait=True)["requests"] == 2
        assert m.prefetch_ranges([[500000, 1]])["requests"] == 1
        for bad in ([(len(data), 1)], [(-1, 5)], [(0, 2**64 - 1), (5, 2**64 - 1)], [(1, 2, 3)],
                    [[1]], ["ab"], 5):
            with pytest.raises(ValueError):
                m.prefetch_ranges(bad)
        with pytest.raises(ValueError):
            m.prefetch_ranges([0, 1], [1])
        with pytest.raises(ValueError):
            m.prefetch_ranges(numpy.array([-5]), numpy.array([1]))


def test_prefetch_ranges_stays_within_the_budget(data_file):
    path, data = data_file
    budget = 2 << 20
    pager = faultmap.Pager(memory_budget=budget)
    with pager.open(path, readahead="off") as m:
        # 2000 rows of two pages, 16 MB in all: eight times the budget.
        starts = numpy.arange(2000, dtype=numpy.int64) * 24576 + 1000
        lengths = numpy.full(2000, 6000)
        m.prefetch_ranges(starts, lengths, wait=True)
        assert m.memory()["peak"] <= budget + 32 * 4096, m.memory()
        for start in starts[::97].tolist():
            assert m[start:start + 6000] == data[start:start + 6000]
        assert m.memory()["peak"] <= budget + 32 * 4096, m.memory()


def test_closing_the_mapping_cancels_its_batched_prefetch():
    server = FailingServer(pattern(64 << 20, 19))  # noqa: F821 (defined by exec)
    try:
        pager = faultmap.Pager()
        m = pager.open(server.url, readahead="off")
        # 64 rows a MiB apart, each its own request, every GET held until
        # the mapping is closed: only those sent by then (at most io_depth,
        # 32) reach the server.
        server.hold.clear()
        got = m.prefetch_ranges([(i << 20, 100) for i in range(64)])
        assert got["requests"] == 64, got
        deadline = time.monotonic() + 30
        while server.held == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.held > 0
        m.close()
        server.hold.set()
        while pager.memory()["cached"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pager.memory()["cached"] == 0, pager.memory()
        assert server.gets <= 32 + 4, f"{server.gets} of 64 requests sent"
        assert pager.stats()["io_cancelled"] >= 64 - 36, pager.stats()
    finally:
        server.hold.set()
        server.shutdown()
        server.server_close()


def test_counters_have_the_rust_names(small_file):
    path, _ = small_file
    with faultmap.open(path, fault_around_order=0, readahead="off") as m:
        assert m.fault_around_order == 0
        m.fault_around_order = 3
        assert m.fault_around_order == 3
        with pytest.raises(ValueError):
            m.fault_around_order = 10
        zlib.crc32(memoryview(m)[:40960])
        stats = m.stats()
        for name in ["pgfault", "pgmajfault", "pgfault_around", "io_count", "io_bytes",
                     "io_errors", "evicted", "refault", "write_faults", "written_back"]:
            assert isinstance(stats[name], int), name
        assert stats["pgfault"] >= 1
        ra = m.ra_stats()
        assert set(ra) >= {"initial", "subsequent", "marker", "around", "random", "all"}
        assert set(m.memory()) == {"budget", "cached", "peak", "active"}
        assert m.io_errors() == []


def test_a_pager_shares_its_budget(small_file, tmp_path):
    path, data = small_file
    other = tmp_path / "other.bin"
    other.write_bytes(data[::-1])
    pager = faultmap.Pager(memory_budget=4 << 20)
    assert pager.delivery == "handler"
    a = pager.open(path)
    b = faultmap.open(other, pager=pager)
    assert a[:] == data
    assert b[:] == data[::-1]
    memory = pager.memory()
    assert memory["budget"] == 4 << 20
    # The pages faults wait for are charged even over the limit: the same
    # slack as the Rust budget tests.
    assert memory["cached"] <= (4 << 20) + 8 * 4096
    assert pager.stats()["pgfault"] >= a.stats()["pgfault"]
    a.close()
    b.close()
    with faultmap.open(path, memory_budget=2 << 20) as c:
        assert c[:] == data
        assert c.memory()["budget"] == 2 << 20


# ---------------------------------------------------------------------------
# Lifetime.


def test_close_with_exports_raises_buffer_error(small_file):
    path, _ = small_file
    m = faultmap.open(path)
    view = memoryview(m)
    with pytest.raises(BufferError):
        m.close()
    assert not m.closed
    view.release()
    m.close()
    assert m.closed
    m.close()  # twice: nothing
    with pytest.raises(ValueError):
        m[0:1]
    with pytest.raises(ValueError):
        memoryview(m)
    with pytest.raises(ValueError):
        m.stats()
    assert len(m) == len(_) and "closed" in repr(m)


def test_an_array_outlives_its_mapping_object(small_file):
    path, data = small_file
    m = faultmap.open(path)
    a = m.array(numpy.uint8)
    with pytest.raises(BufferError):
        m.close()
    del m
    gc.collect()
    assert bytes(a[: 1 << 20]) == data[: 1 << 20]
    assert a[-1] == data[len(a) - 1]


def test_with_block_closes_and_exit_does_not_swallow(small_file):
    path, _ = small_file
    with pytest.raises(KeyError):
        with faultmap.open(path) as m:
            raise KeyError("x")
    assert m.closed


# ---------------------------------------------------------------------------
# Errors.


def test_missing_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        faultmap.open(tmp_path / "nope.bin")
    assert e.value.errno == errno.ENOENT
    assert "nope.bin" in str(e.value)


def test_directory_is_is_a_directory_error(tmp_path):
    with pytest.raises(IsADirectoryError) as e:
        faultmap.open(tmp_path)
    assert e.value.errno == errno.EISDIR


def test_bad_arguments_are_value_or_type_errors(small_file):
    path, _ = small_file
    for kwargs in [
        {"readahead": "sometimes"},
        {"fault_around_order": 10},
        {"offset": 1 << 40},
        {"length": 1 << 40},
        {"memory_budget": 1},
    ]:
        with pytest.raises(ValueError):
            faultmap.open(path, **kwargs)
    with pytest.raises(OverflowError):
        faultmap.open(path, offset=-4096)
    with pytest.raises(TypeError):
        faultmap.open(12)
    with pytest.raises(TypeError):
        faultmap.open(path, 0)  # keyword-only
    with pytest.raises(ValueError):
        faultmap.Pager(delivery="pigeon")
    with pytest.raises(ValueError):
        faultmap.open("ftp://example.com/x")


def test_writable_url_is_read_only_file_system():
    # Refused before any request: no server needed.
    for url in ["s3://bucket/key", "https://example.com/x"]:
        with pytest.raises(OSError) as e:
            faultmap.open(url, writable=True)
        assert e.value.errno == errno.EROFS


def test_permission_denied_is_permission_error(s3_object):
    url, _ = s3_object
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY="not-the-secret")
    r = run_python(
        f"""
        import faultmap
        try:
            faultmap.open({url!r})
        except PermissionError as e:
            print("PermissionError", e.errno)
            assert "not-the-secret" not in str(e)
        """,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["PermissionError", str(errno.EACCES)]


def test_missing_object_is_file_not_found(s3_object):
    url, _ = s3_object
    with pytest.raises(FileNotFoundError):
        faultmap.open(url + ".missing")
    http = server_env("FAULTMAP_HTTP_URL")
    with pytest.raises(FileNotFoundError):
        faultmap.open(http + "/no-such-object.bin")


def test_an_object_without_validators_is_refused_unless_allowed(failing_server):
    # A server that sends neither an ETag nor a Last-Modified: a change to
    # the object could not be seen, so it is refused...
    failing_server.validators = False
    with pytest.raises(OSError) as refused:
        faultmap.open(failing_server.url)
    assert refused.value.errno == errno.EOPNOTSUPP
    assert failing_server.url in str(refused.value)
    assert "allow_unpinned" in str(refused.value)
    # ...unless the caller says so.
    with faultmap.open(failing_server.url, allow_unpinned=True) as m:
        assert m[:] == failing_server.data


def test_io_timeout_is_the_deadline_of_an_open():
    # A listener that never accepts: the connection completes in the
    # kernel's backlog, and nothing ever answers.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/object.bin"
        pager = faultmap.Pager(io_timeout=0.5, io_retries=3)
        with pytest.raises(TimeoutError) as timed_out:
            pager.open(url)
        assert url in str(timed_out.value)
        assert "open deadline of 500ms" in str(timed_out.value)


def test_io_settings_are_checked():
    for bad in [0, -1.0, float("nan"), float("inf")]:
        with pytest.raises(ValueError, match="io_timeout"):
            faultmap.Pager(io_timeout=bad)
    with pytest.raises(ValueError, match="io_retries"):
        faultmap.Pager(io_retries=17)
    faultmap.Pager(io_timeout=2.5, io_retries=0)


def test_a_failed_store_read_is_an_os_error_when_sliced(failing_server):
    data = failing_server.data
    pager = faultmap.Pager()
    # A slice is copied by the kernel (whose faults a handler-delivery
    # pager serves as root), or, under the protect engine or a userfaultfd
    # for user-mode faults only, read in first: either way a failed page
    # is an OSError, never SIGBUS (which would end this test session).
    with pager.open(failing_server.url, readahead="off") as m:
        assert m[0:100] == data[0:100]
        failing_server.fail = True
        with pytest.raises(OSError) as e:
            m[500_000:500_010]
        assert e.value.errno == errno.EIO
        assert "500 Internal Server Error" in str(e.value)
        assert "byte 500000 " in str(e.value)
        with pytest.raises(OSError):
            m[700_000]
        assert m[0:100] == data[0:100]  # cached pages still read
        reports = m.io_errors()
        assert reports and reports[-1]["kind"] == "Read"
        # The store recovers: the failed pages are read again.
        failing_server.fail = False
        assert m[500_000:500_010] == data[500_000:500_010]
        assert m[700_000] == data[700_000]
        # (Slices, not a memoryview: this server runs in this process, and
        # a memoryview's fault would hold the GIL it needs to answer.)
        assert m[400_000:800_000] == data[400_000:800_000]


def test_a_failed_store_read_at_an_access_is_sigbus(failing_server):
    # numpy and memoryview access the bytes directly: a page the store
    # cannot read ends the process with SIGBUS, as for mmap of a file;
    # faulthandler names the Python line. The server runs here, in the
    # test's process: the child's faulting thread holds its GIL.
    failing_server.fail = True  # from byte 4096 on: the open works
    r = run_python(
        f"""
        import faulthandler, numpy, faultmap
        faulthandler.enable()
        m = faultmap.open({failing_server.url!r}, readahead="off")
        a = m.array(numpy.uint8)
        print("touching", flush=True)
        a[600_000] + 1
        print("survived", flush=True)
        """
    )
    assert r.stdout.split() == ["touching"], r.stderr
    assert r.returncode == -signal.SIGBUS
    assert "Bus error" in r.stderr and "line 7" in r.stderr


# ---------------------------------------------------------------------------
# Remote objects.


def test_s3_object_reads_like_the_file(s3_object):
    url, data = s3_object
    with faultmap.open(url) as m:
        assert len(m) == len(data)
        assert zlib.crc32(memoryview(m)) == zlib.crc32(data)
        assert m[1000:2000] == data[1000:2000]
        a = m.array(numpy.uint16, offset=2)
        assert a.sum(dtype=numpy.uint64) == numpy.frombuffer(data, numpy.uint16, offset=2,
                                                             count=len(a)).sum(dtype=numpy.uint64)
        assert m.stats()["io_count"] >= 1
        del a


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_gcs_and_azure_objects_read_like_the_file(scheme, tmp_path):
    """An object put into the project's GCS server or Azurite with
    `scripts/remote-servers put` reads like its file; a missing one is
    FileNotFoundError, as on S3."""
    bucket = server_env({"gs": "FAULTMAP_GS_BUCKET", "az": "FAULTMAP_AZ_CONTAINER"}[scheme])
    data = pattern(3 * 1024 * 1024 + 77, 23)
    src = tmp_path / "object.bin"
    src.write_bytes(data)
    url = f"{scheme}://{bucket}/py-{os.getpid()}/object.bin"
    repo = pathlib.Path(__file__).resolve().parents[2]
    subprocess.run([repo / "scripts" / "remote-servers", "put", url, src], check=True,
                   timeout=120)
    with faultmap.open(url) as m:
        assert len(m) == len(data)
        rows = [(5, 100), (2_000_000, 5000)]
        assert m.prefetch_ranges(rows, wait=True)["requests"] >= 1
        for start, length in rows:
            assert m[start:start + length] == data[start:start + length]
        assert zlib.crc32(memoryview(m)) == zlib.crc32(data)
    with pytest.raises(FileNotFoundError):
        faultmap.open(url + ".missing")
    if scheme == "gs":  # a file in the server's folder (Azurite's goes with its memory)
        shutil.rmtree(pathlib.Path(server_env("FAULTMAP_GS_ROOT")) / f"py-{os.getpid()}")


# ---------------------------------------------------------------------------
# The kernel's own reads of a mapping.


def test_file_write_of_an_untouched_mapping(small_file, tmp_path):
    # The kernel reads the pages: handler delivery serves it, as root under
    # the userfaultfd engine. Where it cannot (the protect engine, a
    # userfaultfd for user-mode faults only) the write fails with EFAULT,
    # and m.populate() first makes it work.
    path, data = small_file
    out = tmp_path / "copy.bin"
    pager = faultmap.Pager()
    with pager.open(path) as m, open(out, "wb", buffering=0) as f:
        if not pager.serves_kernel_faults:
            with pytest.raises(OSError) as e:
                f.write(m)
            assert e.value.errno == errno.EFAULT
            m.populate()
        f.write(m)
    assert out.read_bytes() == data
    with pager.open(path) as m:
        fd = os.open(out, os.O_WRONLY | os.O_TRUNC)
        try:
            if not pager.serves_kernel_faults:
                m.populate(4096 * 100, 4096 * 110)
            assert os.write(fd, memoryview(m)[4096 * 100 : 4096 * 110]) == 40960
        finally:
            os.close(fd)
    assert out.read_bytes() == data[4096 * 100 : 4096 * 110]


def test_signal_delivery_kernel_reads_fail_with_efault(small_file, tmp_path):
    # What the documentation says of delivery="signal": faster faults, but
    # the kernel's own read of a page not yet mapped fails.
    path, data = small_file
    pager = faultmap.Pager(delivery="signal")
    assert not pager.serves_kernel_faults
    with pager.open(path) as m, open(tmp_path / "x", "wb", buffering=0) as f:
        with pytest.raises(OSError) as e:
            f.write(memoryview(m)[: 1 << 20])
        assert e.value.errno == errno.EFAULT
        assert m[: 1 << 20] == data[: 1 << 20]  # user-space copies work
        assert f.write(memoryview(m)[: 1 << 20]) == 1 << 20  # mapped now


# ---------------------------------------------------------------------------
# fork, documentation.


def test_fork_child_leaves_the_parents_dirty_pages_to_the_parent(small_file):
    # A child that closes (or drops) a writable mapping it inherited does
    # not write the parent's dirty pages: the parent does, when it flushes.
    path, data = small_file
    r = run_python(
        f"""
        import os, sys, time, faultmap
        m = faultmap.open({str(path)!r}, writable=True)
        view = memoryview(m)
        view[0:4] = b"DIRT"
        view.release()
        pid = os.fork()
        if pid == 0:
            started = time.monotonic()
            m.close()
            sys.exit(0 if time.monotonic() - started < 5 else 1)  # atexit runs too
        _, status = os.waitpid(pid, 0)
        with open({str(path)!r}, "rb") as f:
            before = f.read(4)
        m.flush()
        with open({str(path)!r}, "rb") as f:
            after = f.read(4)
        print(os.waitstatus_to_exitcode(status), before, after)
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", repr(data[:4]), "b'DIRT'"]


@pytest.mark.parametrize(
    "through, writable", [("memoryview", False), ("numpy", False), ("memoryview", True)]
)
def test_fork_child_reads_and_writes_through_a_parents_view(small_file, through, writable):
    # A memoryview or numpy array made before fork() works in the child: the
    # child maps the range again at the same address, and the parent serves
    # its faults from its own cache. What it reads is the file's bytes,
    # never the child's own memory (nothing it maps can land there), and a
    # write through a writable view is the parent's too (MAP_SHARED).
    import ast

    path, data = small_file
    r = run_python(
        f"""
        import ctypes, mmap, os, numpy, faultmap
        SECRET, SIZE = b"CHILD-SECRET-001", 64 * 1024
        MAP_FIXED_NOREPLACE = 0x100000
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                              ctypes.c_int, ctypes.c_int, ctypes.c_long]
        m = faultmap.open({str(path)!r}, writable={writable})
        view = memoryview(m)
        arr = m.array(numpy.uint8)
        assert bytes(view[:16]) == arr[:16].tobytes() == {data[:16]!r}
        base, length = arr.__array_interface__["data"][0], len(m)
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rd)
            landed, mine = 0, []
            # First at the parent's very address (what malloc or numpy may
            # get by chance): the range is taken, so it must fail.
            got = libc.mmap(base, SIZE, mmap.PROT_READ | mmap.PROT_WRITE,
                            mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
            if got == base:
                ctypes.memmove(base, SECRET * (SIZE // 16), SIZE)
                landed += 1
            for _ in range(200):
                mm = mmap.mmap(-1, SIZE)
                mm.write(SECRET * (SIZE // 16))
                at = numpy.frombuffer(mm, numpy.uint8).__array_interface__["data"][0]
                landed += at < base + length and base < at + SIZE
                mine.append(mm)
            os.write(wr, b"landed %d;" % landed)
            if {writable}:
                view[4096:4112] = b"CHILD-PTR-WRITE!"
                changed = sum(mm[:] != SECRET * (SIZE // 16) for mm in mine)
                os.write(wr, b"changed %d;" % changed)
            elif {through!r} == "numpy":
                os.write(wr, b"sum %d;" % int(arr.sum(dtype=numpy.uint64)))
            else:
                os.write(wr, b"read " + bytes(view[:16]) + b";")
                os.write(wr, b"slice %d;" % (m[:] == open({str(path)!r}, "rb").read()))
            os._exit(0)
        os.close(wr)
        _, status = os.waitpid(pid, 0)
        said = b""
        while chunk := os.read(rd, 65536):
            said += chunk
        print(repr(said))
        print(os.waitstatus_to_exitcode(status))
        print(repr(bytes(view[4096:4112])))
        """
    )
    assert r.returncode == 0, r.stderr
    said, code, seen = r.stdout.splitlines()
    said = ast.literal_eval(said)
    assert code == "0", (said, r.stderr)
    assert b"CHILD-SECRET-001" not in said, said
    if writable:
        assert said == b"landed 0;changed 0;", said
        assert ast.literal_eval(seen) == b"CHILD-PTR-WRITE!"  # the parent sees it
    elif through == "numpy":
        assert said == b"landed 0;sum %d;" % sum(data), said
    else:
        assert said == b"landed 0;read " + data[:16] + b";slice 1;", said


FORK_POOL = """
import hashlib, multiprocessing, os, random, sys, faultmap
pager = faultmap.Pager(delivery=sys.argv[1])
m = pager.open(sys.argv[2])  # in the parent, as a Dataset's __init__ does
size = len(m)

def work(seed):
    rng = random.Random(seed)
    whole = hashlib.sha256(memoryview(m)).hexdigest()
    samples = []
    for _ in range(64):
        at = rng.randrange(size - 4096)
        samples.append((at, hashlib.sha256(m[at:at + 4096]).hexdigest()))
    return whole, samples

if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(4) as pool:
        for whole, samples in pool.map(work, range(4)):
            print(whole)
            for at, digest in samples:
                print(at, digest)
"""


@pytest.mark.parametrize("delivery", ["handler", "signal"])
def test_a_fork_pool_of_four_reads_one_cache(tmp_path, delivery):
    # The DataLoader pattern: the object is opened in the parent, four fork
    # workers each read all of it and 64 random samples. The bytes are
    # right, and the server sends the object about once (not four times):
    # the workers' faults are served from the parent's cache.
    import hashlib

    data = pattern(8 * 1024 * 1024 + 123, 29)
    server = FailingServer(data)
    script = tmp_path / "pool.py"
    script.write_text(FORK_POOL)
    try:
        r = subprocess.run(
            [sys.executable, str(script), delivery, server.url],
            capture_output=True, text=True, timeout=300,
        )
        sent = server.sent
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 4 * 65, r.stdout[:500]
    whole = hashlib.sha256(data).hexdigest()
    for worker in range(4):
        block = lines[worker * 65:(worker + 1) * 65]
        assert block[0] == whole, f"worker {worker}: the whole object"
        for line in block[1:]:
            at, digest = line.split()
            at = int(at)
            assert digest == hashlib.sha256(data[at:at + 4096]).hexdigest(), f"worker {worker} at {at}"
    assert sent <= 1.1 * len(data), f"{sent} bytes sent for {len(data)}: not one cache"


UNRELATED_READER = """
import hashlib, random, sys, faultmap
pager = faultmap.Pager(delivery=sys.argv[1])  # sharing on: FAULTMAP_SHARED=1
m = pager.open(sys.argv[2])
print(m.sharing, m.sharing_error, flush=True)
sys.stdin.readline()
rng = random.Random(int(sys.argv[3]))
print(hashlib.sha256(memoryview(m)).hexdigest(), flush=True)
for _ in range(64):
    at = rng.randrange(len(m) - 4096)
    print(at, hashlib.sha256(m[at:at + 4096]).hexdigest(), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("delivery", ["handler", "signal"])
def test_two_unrelated_processes_with_the_switch_on_read_one_cache(tmp_path, delivery):
    # Two processes that share nothing but the user and the switch
    # (FAULTMAP_SHARED=1) open the same URL: the first owns the cache, the
    # second joins it, both read the whole object and random samples at
    # once, the bytes are right, and the server sends the object about
    # once.
    import hashlib

    data = pattern(8 * 1024 * 1024 + 321, 31)
    server = FailingServer(data)
    script = tmp_path / "reader.py"
    script.write_text(UNRELATED_READER)
    # A short path: a Unix socket's path holds at most 107 bytes, and
    # pytest's tmp_path can be long.
    meet = pathlib.Path(tempfile.mkdtemp(prefix="fm-meet-", dir="/tmp"))
    env = dict(os.environ, FAULTMAP_SHARED="1", FAULTMAP_SHARED_DIR=str(meet))
    procs = []
    # A hang fails the test instead of hanging it: the readers are killed
    # after 3 minutes, and their lines then end early.
    def kill_all():
        for p in procs:
            if p.poll() is None:
                p.kill()
    watchdog = threading.Timer(180, kill_all)
    watchdog.start()
    try:
        for seed in (1, 2):
            err = open(tmp_path / f"reader-{seed}.err", "w")
            p = subprocess.Popen(
                [sys.executable, str(script), delivery, server.url, str(seed)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                text=True, env=env,
            )
            err.close()
            procs.append(p)
            # Each says how it shares before the next starts.
            procs[-1].role = p.stdout.readline().split()[0]
        # Under either engine (the protect engine grants a joiner its
        # pages and takes them back).
        assert [p.role for p in procs] == ["owner", "joined"], [p.role for p in procs]
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [[p.stdout.readline().strip() for _ in range(65)] for p in procs]
        for seed, p in reversed(list(zip((1, 2), procs))):  # the joiner first, then the owner
            p.communicate("go\n", timeout=120)
            assert p.returncode == 0, (tmp_path / f"reader-{seed}.err").read_text()
        sent = server.sent
    finally:
        watchdog.cancel()
        shutil.rmtree(meet, ignore_errors=True)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        server.shutdown()
        server.server_close()
    whole = hashlib.sha256(data).hexdigest()
    for who, lines in zip(["owner", "joiner"], outputs):
        assert lines[0] == whole, f"the {who}: the whole object"
        for line in lines[1:]:
            at, digest = line.split()
            at = int(at)
            assert digest == hashlib.sha256(data[at:at + 4096]).hexdigest(), f"the {who} at {at}"
    assert sent <= 1.1 * len(data), f"{sent} bytes sent for {len(data)}: not one cache"


def test_writes_of_a_mapping_never_freed_reach_the_file_at_exit(small_file):
    # Held by a daemon thread until the interpreter exits: never freed, but
    # written back by the exit hook, as mmap's pages would be.
    path, data = small_file
    r = run_python(
        f"""
        import threading, time, faultmap
        m = faultmap.open({str(path)!r}, writable=True)
        memoryview(m)[100:104] = b"EXIT"
        threading.Thread(target=lambda m=m: time.sleep(3600), daemon=True).start()
        """
    )
    assert r.returncode == 0, r.stderr
    assert path.read_bytes()[100:104] == b"EXIT"
    assert path.read_bytes()[104:] == data[104:]


def test_fork_child_opens_a_url_after_the_parent_did():
    # The parent's network runtime has no threads in the child: the child
    # builds its own, so its remote opens do not hang.
    root = pathlib.Path(server_env("FAULTMAP_HTTP_ROOT"))
    name = f"py-fork-{os.getpid()}.bin"
    data = pattern(256 * 1024, 19)
    (root / name).write_bytes(data)
    url = server_env("FAULTMAP_HTTP_URL") + "/" + name
    try:
        r = run_python(
            f"""
            import os, time, faultmap
            m = faultmap.open({url!r})
            assert m[0:8] == {data[:8]!r}
            pid = os.fork()
            if pid == 0:
                with faultmap.open({url!r}) as c:
                    os._exit(0 if c[1000:1008] == {data[1000:1008]!r} else 1)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    print("exit", os.waitstatus_to_exitcode(status))
                    break
                time.sleep(0.05)
            else:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                print("hung")
            """
        )
    finally:
        (root / name).unlink(missing_ok=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["exit", "0"]


def test_a_fork_child_that_maps_its_own_object_still_reads_the_inherited_one(tmp_path):
    # A child that maps something itself becomes an owner of its own; the
    # mapping it inherited is still served by its parent.
    big = tmp_path / "big.bin"
    data = pattern(4 * 1024 * 1024 + 5, 41)
    big.write_bytes(data)
    other = tmp_path / "other.bin"
    other.write_bytes(pattern(100_000, 42))
    r = run_python(
        f"""
        import hashlib, os, faultmap
        a = faultmap.open({str(big)!r})
        pid = os.fork()
        if pid == 0:
            b = faultmap.open({str(other)!r})
            ok = bytes(b[:10]) == open({str(other)!r}, "rb").read()[:10]
            whole = hashlib.sha256(memoryview(a)).hexdigest()
            print(ok, whole, flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """
    )
    assert r.returncode == 0, r.stderr
    import hashlib
    assert r.stdout.split() == ["True", hashlib.sha256(data).hexdigest(), "0"], r.stdout + r.stderr


def test_fork_child_makes_its_own_default_pager(small_file):
    path, data = small_file
    r = run_python(
        f"""
        import gc, os, time, faultmap
        m = faultmap.open({str(path)!r})
        first = m[0:64]
        pager = faultmap.Pager()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                with faultmap.open({str(path)!r}) as c:
                    code |= 0 if c[0:64] == first else 1
                try:
                    pager.open({str(path)!r})
                    code |= 2
                except RuntimeError:
                    pass
                # The inherited mapping's bytes are served by the parent;
                # the rest of it (statistics, flush, advice) is the parent's.
                code |= 0 if m[0:64] == first and bytes(memoryview(m)[:64]) == first else 16
                for use in (m.stats, m.flush, lambda: m.advise("random")):
                    try:
                        use()
                        code |= 4
                    except RuntimeError:
                        pass
                started = time.monotonic()
                del m, pager  # drops the parent's: harmless, and quick
                gc.collect()
                code |= 8 if time.monotonic() - started > 5 else 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), m[0:64] == first, m[:] == open({str(path)!r}, "rb").read())
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "True", "True"]


def test_every_public_name_is_documented_and_typed():
    for obj in [faultmap.open, faultmap.Mapping, faultmap.Pager,
                faultmap.Mapping.array, faultmap.Mapping.prefetch, faultmap.Mapping.close,
                faultmap.Pager.open]:
        assert obj.__doc__ and len(obj.__doc__) > 40, obj
    assert "path_or_url" in faultmap.open.__doc__
    package = pathlib.Path(faultmap.__file__).parent
    assert (package / "py.typed").exists()
    stubs = (package / "__init__.pyi").read_text()
    for name in faultmap.__all__:
        defined = [f"def {name}(", f"class {name}", f"{name}: "]
        assert any(d in stubs for d in defined), name
    for method in ["array", "advise", "prefetch", "invalidate", "flush", "stats",
                   "ra_stats", "memory", "io_errors", "close"]:
        assert f"def {method}(" in stubs, method


def test_adaptive_fault_around(small_file):
    path, data = small_file
    with faultmap.open(path) as m:
        assert m.fault_around_order == 4, "the default"
    with faultmap.open(path, fault_around_order="auto") as m:
        assert m.fault_around_order == "auto"
        assert m[:] == data
        stats = m.stats()
        assert stats["fault_around_auto"] > 0
        assert stats["fault_around_auto_pages"] >= stats["fault_around_auto"] * 4
        m.fault_around_order = 2
        assert m.fault_around_order == 2
        m.fault_around_order = "auto"
        assert m.fault_around_order == "auto"
        for bad in ["sometimes", 10, 255]:
            with pytest.raises(ValueError):
                m.fault_around_order = bad
    with pytest.raises(ValueError):
        faultmap.open(path, fault_around_order=255)
    with pytest.raises(TypeError):
        faultmap.open(path, fault_around_order=2.5)


def test_access_trace_record_and_replay(small_file, tmp_path):
    path, data = small_file
    trace = tmp_path / "touches.trace"
    pages = [700, 3, 4, 250, 9, 3]
    with faultmap.open(path, record_trace=True) as m:
        for p in pages:
            assert m[p * 4096] == data[p * 4096]
        size = m.save_trace(trace)
        assert size == {"pages": 5, "runs": 4, "bytes": trace.stat().st_size}
        assert m.stats()["trace_recorded"] == 5
        assert m.replay_progress() is None
    # A new pager: a cold cache. The replay reads the trace's four runs,
    # each its page alone (readahead off), before the program touches them.
    cold = faultmap.Pager()
    with cold.open(path, readahead="off", replay_trace=trace) as m:
        progress = m.replay_progress()
        assert progress["pages"] == 5
        deadline = time.monotonic() + 20
        while not m.replay_progress()["done"] and time.monotonic() < deadline:
            time.sleep(0.001)
        assert m.replay_progress()["done"]
        for p in pages:
            assert m[p * 4096] == data[p * 4096]
        stats = m.stats()
        assert stats["pgmajfault"] == 0
        assert (stats["trace_replayed"], stats["io_count"]) == (5, 4)
    with faultmap.open(path) as m, pytest.raises(ValueError, match="record_trace"):
        m.save_trace(tmp_path / "none.trace")
    # Another version of the file (its mtime moved): refused, saying why.
    os.utime(path, (1_000_000, 1_000_000))
    with pytest.raises(ValueError, match="recorded on"):
        faultmap.open(path, replay_trace=trace)
    with pytest.raises(ValueError, match="not a usable faultmap trace"):
        faultmap.open(path, replay_trace=path)
    with pytest.raises(FileNotFoundError):
        faultmap.open(path, replay_trace=tmp_path / "missing.trace")
    with pytest.raises(TypeError):
        faultmap.open(path, replay_trace=b"bytes.trace")


# ---------------------------------------------------------------------------
# 2 MiB pages.


def test_2m_pages_read_like_the_file(tmp_path, huge_pages):
    # 3 pages and a tail of 100 bytes: 4 huge pages per object; three
    # objects at once (the pool must hold each whole).
    data = pattern(3 * HUGE + 100, 19)
    path = tmp_path / "huge.bin"
    path.write_bytes(data)
    huge_pages(12)
    with faultmap.open(path, page_size="2M") as m:
        assert m.page_size == HUGE == 2097152
        # A byte of every 4 KiB page through numpy, in place: one fault
        # per 2 MiB page.
        a = m.array(numpy.uint8)
        assert numpy.array_equal(a[::4096], numpy.frombuffer(data, numpy.uint8)[::4096])
        assert m.stats()["pgfault"] == 4
        assert numpy.array_equal(a, numpy.fromfile(path, dtype=numpy.uint8))
        del a
        assert m[:] == data
        assert bytes(memoryview(m)[HUGE - 3:HUGE + 3]) == data[HUGE - 3:HUGE + 3]
    # The int spelling, an unaligned part, and a pager whose objects are
    # in 2 MiB pages unless told otherwise.
    start = HUGE + 4097
    with faultmap.open(path, page_size=2097152, offset=start, length=10_000) as m:
        assert m.page_size == HUGE
        assert m[:] == data[start:start + 10_000]
    pager = faultmap.Pager(page_size="2M", memory_budget=16 << 20)
    assert pager.page_size == HUGE
    with pager.open(path) as m, pager.open(path, page_size="4K") as small:
        assert (m.page_size, small.page_size) == (HUGE, 4096)
        assert m[:] == data and small[:] == data
    # An object of 12 huge pages under the budget of 8: pages are evicted,
    # and what comes back reads right.
    big_data = pattern(12 * HUGE, 23)
    big = tmp_path / "big.bin"
    big.write_bytes(big_data)
    with pager.open(big) as m:
        assert m[:] == big_data and m[:] == big_data
        assert pager.stats()["evicted"] > 0
        # The budget is kept, but for one page per fault in flight.
        assert pager.memory()["peak"] <= (16 << 20) + HUGE
    assert faultmap.Pager().page_size == 4096
    with faultmap.open(path) as m:
        assert m.page_size == faultmap.PAGE_SIZE == 4096


def test_2m_pages_refused_when_the_pool_is_too_small(tmp_path, huge_pages):
    # Nothing added: the pool as it was (empty on a fresh machine) cannot
    # hold an object 3 huge pages larger than it has free. A sparse file:
    # nothing is read before the refusal.
    huge_pages(0)
    pages = int(FREE_HUGEPAGES.read_text()) + 3
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.truncate(pages * HUGE)
    with pytest.raises(OSError) as e:
        faultmap.open(path, page_size="2M")
    assert e.value.errno == errno.ENOMEM
    assert "vm.nr_hugepages" in str(e.value)
    assert f"needs {pages} huge pages" in str(e.value)
    # Nothing falls back to 4 KiB pages: without page_size they are used.
    with faultmap.open(path) as m:
        assert m.page_size == 4096 and m[-1] == 0


def test_bad_page_sizes_are_value_or_type_errors(small_file):
    path, _ = small_file
    for bad in ["1G", "2", "", "4K4", 8192, 0, -4096, 2**70, True]:
        with pytest.raises(ValueError, match="page_size"):
            faultmap.open(path, page_size=bad)
        with pytest.raises(ValueError, match="page_size"):
            faultmap.Pager(page_size=bad)
    for bad in [4096.0, b"4K", [4096]]:
        with pytest.raises(TypeError, match="page_size"):
            faultmap.open(path, page_size=bad)
    # A budget of its own is in the pager's page size only: said before
    # anything is opened.
    with pytest.raises(ValueError, match="memory_budget.*Pager\\(page_size="):
        faultmap.open(path, page_size="2M", memory_budget=4 << 20)
    with faultmap.open(path, page_size="4K", memory_budget=4 << 20) as m:
        assert m.page_size == 4096


# ---------------------------------------------------------------------------
# The protect engine (no userfaultfd: containers), asked for explicitly.


def test_the_protect_engine_reads_writes_and_says_so(small_file, tmp_path):
    path, data = small_file
    pager = faultmap.Pager(engine="protect")
    assert pager.engine == "protect"
    assert "asked for" in pager.engine_why
    assert not pager.serves_kernel_faults
    with pager.open(path) as m:
        assert bytes(m) == data
        assert zlib.crc32(memoryview(m)) == zlib.crc32(data)
        assert m.stats()["forwarded"] > 0
    areas = pager.areas()
    assert set(areas) == {
        "areas",
        "peak",
        "mark",
        "resets",
        "guard_regions",
        "child_revokes",
        "child_revokes_failed",
    }, areas
    copy = tmp_path / "copy.bin"
    copy.write_bytes(data)
    with pager.open(copy, writable=True) as w:
        memoryview(w)[5000:5008] = b"PROTECT!"
        assert w.flush() >= 1
    assert copy.read_bytes()[5000:5008] == b"PROTECT!"
    if protect_engine():
        # No userfaultfd here: asking for it says what to do instead.
        with pytest.raises(Exception, match="In containers"):
            faultmap.Pager(engine="userfaultfd")
    else:
        assert faultmap.Pager(engine="userfaultfd").engine == "userfaultfd"
    with pytest.raises(ValueError, match="engine must be"):
        faultmap.Pager(engine="mprotect")


def test_populate_lets_the_kernel_use_a_protect_mapping(small_file, tmp_path):
    path, data = small_file
    pager = faultmap.Pager(engine="protect")
    with pager.open(path) as m, open(tmp_path / "out.bin", "wb", buffering=0) as f:
        with pytest.raises(OSError) as e:
            f.write(memoryview(m)[8192:16384])
        assert e.value.errno == errno.EFAULT
        m.populate(8192, 16384)
        assert f.write(memoryview(m)[8192:16384]) == 8192
        with pytest.raises(ValueError):
            m.populate(0, len(m) + 1)
    assert (tmp_path / "out.bin").read_bytes() == data[8192:16384]
    # A readinto a writable mapping: the kernel writes it.
    target = tmp_path / "target.bin"
    target.write_bytes(bytes(len(data)))
    with pager.open(target, writable=True) as w, open(path, "rb", buffering=0) as src:
        w.populate(0, 65536)
        assert src.readinto(memoryview(w)[0:65536]) == 65536
        w.flush()
    assert target.read_bytes()[:65536] == data[:65536]


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_foreign_segfault_under_protect_reaches_faulthandler(small_file, when):
    # A SIGSEGV that is not the protect engine's is the application's as
    # without faultmap: Python's faulthandler prints its traceback, and the
    # process dies of SIGSEGV. Enabled before the pager, or after it (the
    # next mapping puts faultmap's handler back, chaining to faulthandler).
    path, data = small_file
    r = run_python(
        f"""
        import ctypes, faulthandler, sys, faultmap
        if {when!r} == "before":
            faulthandler.enable()
        pager = faultmap.Pager(engine="protect")
        m = pager.open({str(path)!r})
        if {when!r} == "after":
            faulthandler.enable()
            m = pager.open({str(path)!r})
        ok = bytes(m[:100]) == open({str(path)!r}, "rb").read(100)
        print("read", ok, flush=True)
        ctypes.string_at(8)
        print("survived", flush=True)
        """
    )
    assert "read True" in r.stdout, (r.stdout, r.stderr)
    assert "survived" not in r.stdout
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stderr)
    # Once: faulthandler's own re-raise ends the process, not a loop.
    assert r.stderr.count("Fatal Python error: Segmentation fault") == 1, r.stderr[:2000]
