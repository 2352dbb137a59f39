"""faultmap's disk cache from Python: Pager(disk_cache=..., disk_cache_max=...)
and Mapping.disk_cache_stats(), over the tests' own HTTP server (which
counts the requests and bytes it serves) and real directories."""

import json
import os
import pathlib
import zlib

import pytest

import faultmap
from conftest import FailingServer, pattern, run_python

# Two of the disk cache's 4 MiB chunks, the second one partial, and a tail
# that is not a whole page.
OBJECT_BYTES = 5 * 1024 * 1024 + 4321


@pytest.fixture
def server():
    """The tests' HTTP server (an ETag, ranged GETs; `gets` and `sent`
    count the GETs and the body bytes it answered) over OBJECT_BYTES of
    pattern bytes; shut down afterwards."""
    server = FailingServer(pattern(OBJECT_BYTES, 23))  # noqa: F821 (conftest's exec)
    yield server
    server.shutdown()
    server.server_close()


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the disk cache's variables, with
    `extra`."""
    drop = ("FAULTMAP_CACHE_DIR", "FAULTMAP_CACHE_MAX")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


# A run of a program that reads the whole object through a disk cache and
# prints its CRC, its length and the cache's counters.
READ_THROUGH_THE_CACHE = """
    import faultmap, json, zlib
    pager = faultmap.Pager(disk_cache={dir!r}, disk_cache_max="64M")
    with pager.open({url!r}) as m:
        print(json.dumps({{"crc": zlib.crc32(m), "len": len(m), "stats": m.disk_cache_stats()}}))
"""


def test_a_second_process_reads_the_object_from_the_disk_cache(server, tmp_path):
    cache = tmp_path / "cache"
    want = zlib.crc32(server.data)
    code = READ_THROUGH_THE_CACHE.format(dir=str(cache), url=server.url)

    # The first run: every byte from the network, and onto the disk.
    gets, sent = server.gets, server.sent
    first = run_python(code, env=clean_env())
    assert first.returncode == 0, first.stderr
    got = json.loads(first.stdout)
    assert got["crc"] == want and got["len"] == OBJECT_BYTES
    stats = got["stats"]
    assert stats["disk_bytes"] == 0, stats
    assert stats["network_bytes"] == OBJECT_BYTES, stats
    assert stats["written_bytes"] == stats["network_bytes"], stats
    assert stats["problems"] == 0 and stats["first_problem"] is None, stats
    assert server.sent - sent >= OBJECT_BYTES
    assert server.gets - gets >= 2
    assert cache.is_dir() and (cache.stat().st_mode & 0o777) == 0o700

    # A second process: every byte from the disk. The server answers the
    # open's HEAD alone (the range probe is left out when the cache holds
    # the version): no GET, no body byte.
    gets, sent = server.gets, server.sent
    second = run_python(code, env=clean_env())
    assert second.returncode == 0, second.stderr
    got = json.loads(second.stdout)
    assert got["crc"] == want and got["len"] == OBJECT_BYTES
    stats = got["stats"]
    assert stats["network_bytes"] == 0, stats
    assert stats["disk_bytes"] == OBJECT_BYTES, stats
    assert stats["written_bytes"] == 0 and stats["waits"] == 0, stats
    assert stats["problems"] == 0 and stats["first_problem"] is None, stats
    assert server.gets - gets == 0, "a GET in the second run"
    assert server.sent - sent == 0, f"{server.sent - sent} body bytes sent to the second run"


def test_disk_cache_stats_is_none_without_a_disk_cache(server, small_file, tmp_path):
    path, data = small_file
    with faultmap.Pager().open(server.url) as m:
        if faultmap.Pager().disk_cache is None:
            assert m.disk_cache_stats() is None
    # A local file is never read through the cache.
    with faultmap.Pager(disk_cache=tmp_path / "cache").open(path) as m:
        assert m[:] == data
        assert m.disk_cache_stats() is None
    assert not (tmp_path / "cache").exists()
    m = faultmap.Pager(disk_cache=tmp_path / "cache").open(server.url)
    assert m.disk_cache_stats()["network_bytes"] == 0
    m.close()
    with pytest.raises(ValueError, match="closed"):
        m.disk_cache_stats()


def test_disk_cache_max_is_an_int_or_a_size(tmp_path):
    cache = tmp_path / "cache"
    pager = faultmap.Pager(disk_cache=cache, disk_cache_max="64M")
    assert pager.disk_cache == cache
    assert pager.disk_cache_max == 64 << 20
    assert faultmap.Pager(disk_cache=str(cache), disk_cache_max=1 << 30).disk_cache_max == 1 << 30
    assert faultmap.Pager(disk_cache=str(cache), disk_cache_max="2GiB").disk_cache_max == 2 << 30
    for bad in ["64X", "", "1.5G", "-1", "0"]:
        with pytest.raises(ValueError, match="disk_cache_max"):
            faultmap.Pager(disk_cache=cache, disk_cache_max=bad)
    for bad in [0, -1, 1 << 64]:
        with pytest.raises(ValueError, match="disk_cache_max"):
            faultmap.Pager(disk_cache=cache, disk_cache_max=bad)
    for bad in [1.5, True, [64]]:
        with pytest.raises(TypeError, match="disk_cache_max"):
            faultmap.Pager(disk_cache=cache, disk_cache_max=bad)
    for bad in [42, 1.5, object()]:
        with pytest.raises(TypeError, match="disk_cache"):
            faultmap.Pager(disk_cache=bad)
    with pytest.raises(ValueError, match="directory is empty"):
        faultmap.Pager(disk_cache="")


def test_a_directory_others_may_write_to_is_refused(server, tmp_path):
    cache = tmp_path / "open"
    cache.mkdir()
    cache.chmod(0o777)
    pager = faultmap.Pager(disk_cache=cache)
    with pytest.raises(OSError) as refused:
        pager.open(server.url)
    assert str(cache) in str(refused.value)
    assert "others may write" in str(refused.value)
    assert not (cache / "objects").exists()


def test_a_directory_of_another_user_is_refused(server, tmp_path):
    if os.geteuid() == 0:
        cache = tmp_path / "theirs"
        cache.mkdir(mode=0o700)
        os.chown(cache, 65534, 65534)
    else:
        # Not root: a directory root owns, and nobody else may write to.
        cache = pathlib.Path("/")
        assert cache.stat().st_uid == 0 and cache.stat().st_mode & 0o022 == 0
    with pytest.raises(OSError) as refused:
        faultmap.Pager(disk_cache=cache).open(server.url)
    assert str(cache) in str(refused.value)
    assert "owned by uid" in str(refused.value)


ENVIRONMENT = """
    import faultmap, json, zlib
    default = faultmap.Pager()
    bounded = faultmap.Pager(disk_cache_max="1G")
    other = faultmap.Pager(disk_cache={other!r})
    with faultmap.open({url!r}) as m:
        zlib.crc32(m)
        stats = m.disk_cache_stats()
    print(json.dumps([
        [str(p.disk_cache), p.disk_cache_max] for p in [default, bounded, other]
    ] + [stats["network_bytes"]]))
"""


def test_the_environment_names_the_default_disk_cache(server, tmp_path):
    env_dir, other = tmp_path / "env", tmp_path / "other"
    code = ENVIRONMENT.format(other=str(other), url=server.url)
    r = run_python(code, env=clean_env(FAULTMAP_CACHE_DIR=str(env_dir), FAULTMAP_CACHE_MAX="32M"))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got[0] == [str(env_dir), 32 << 20]  # the environment's
    assert got[1] == [str(env_dir), 1 << 30]  # disk_cache_max bounds it
    assert got[2] == [str(other), 32 << 20]  # disk_cache replaces it
    assert got[3] == OBJECT_BYTES  # faultmap.open reads through it
    assert (env_dir / "objects").is_dir()

    # Without the variables: no disk cache.
    r = run_python("import faultmap; print(faultmap.Pager().disk_cache)", env=clean_env())
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr

    # A malformed maximum in the environment is refused.
    r = run_python(
        "import faultmap\n"
        "try:\n    faultmap.Pager()\nexcept ValueError as e:\n    print(e)\n",
        env=clean_env(FAULTMAP_CACHE_DIR=str(env_dir), FAULTMAP_CACHE_MAX="lots"),
    )
    assert r.returncode == 0 and "FAULTMAP_CACHE_MAX" in r.stdout, (r.stdout, r.stderr)
