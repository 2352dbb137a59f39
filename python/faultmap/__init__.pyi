"""Type stubs of faultmap (the extension module faultmap._faultmap)."""

import os
import pathlib
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal, Self, SupportsIndex, overload

from typing_extensions import Buffer

import numpy
import numpy.typing

__all__ = ["open", "Mapping", "Pager", "PAGE_SIZE", "__version__"]

__version__: str
PAGE_SIZE: int
"""The default page size: 4096 (page_size="2M" maps in 2 MiB pages)."""

_Readahead = Literal["full", "around", "off"]
_Delivery = Literal["handler", "signal"]
_Advice = int | Literal["normal", "random", "sequential", "willneed", "dontneed"]
_PageSize = Literal["4K", "2M", 4096, 2097152]

def open(
    path_or_url: str | os.PathLike[str],
    *,
    offset: int = 0,
    length: int | None = None,
    writable: bool = False,
    fault_around_order: int | Literal["auto"] | None = None,
    readahead: _Readahead | None = None,
    memory_budget: int | None = None,
    record_trace: bool = False,
    replay_trace: str | os.PathLike[str] | None = None,
    page_size: _PageSize | None = None,
    allow_unpinned: bool = False,
    pager: Pager | None = None,
) -> Mapping:
    """Maps an object: a local path, an http(s):// URL or an s3:// URL.

    page_size="2M" caches and maps it in 2 MiB pages from the kernel's
    pool (vm.nr_hugepages): OSError (errno ENOMEM) when the pool cannot
    hold it.

    Raises FileNotFoundError, PermissionError, IsADirectoryError,
    ValueError (a bad argument) or OSError (with errno) for the rest.
    """

class Pager:
    """A paging engine (userfaultfd, or mprotect where it is refused), the
    threads that serve its faults and read its stores, and a memory budget,
    shared by the mappings it makes."""

    def __init__(
        self,
        *,
        memory_budget: int | None = None,
        io_threads: int | None = None,
        delivery: _Delivery | None = None,
        page_size: _PageSize | None = None,
        io_timeout: float | None = None,
        io_retries: int | None = None,
        shared: bool | None = None,
        engine: Literal["auto", "userfaultfd", "protect"] | None = None,
        disk_cache: str | bytes | os.PathLike[str] | os.PathLike[bytes] | None = None,
        disk_cache_max: int | str | None = None,
    ) -> None:
        """disk_cache: a directory that keeps remote objects' pages on disk
        for later runs and other processes (None: FAULTMAP_CACHE_DIR, else
        none); refused at open (OSError naming it) if another user owns it
        or others may write to it. disk_cache_max: its most bytes, an int
        or a size such as "50G" (None: FAULTMAP_CACHE_MAX, else no
        maximum)."""
    def open(
        self,
        path_or_url: str | os.PathLike[str],
        *,
        offset: int = 0,
        length: int | None = None,
        writable: bool = False,
        fault_around_order: int | Literal["auto"] | None = None,
        readahead: _Readahead | None = None,
        memory_budget: int | None = None,
        record_trace: bool = False,
        replay_trace: str | os.PathLike[str] | None = None,
        page_size: _PageSize | None = None,
        allow_unpinned: bool = False,
    ) -> Mapping:
        """Maps an object with this pager."""
    def stats(self) -> dict[str, int]:
        """The pager's counters (pgfault, pgmajfault, io_count, ...)."""
    def ra_stats(self) -> dict[str, Any]:
        """The pager's readahead table."""
    def memory(self) -> dict[str, int | None]:
        """{"budget", "cached", "peak", "active"} in bytes."""
    def io_errors(self) -> list[dict[str, Any]]:
        """The store failures of the pager's objects, newest last."""
    @property
    def engine(self) -> Literal["userfaultfd", "protect"]:
        """The paging engine that runs."""
    @property
    def engine_why(self) -> str:
        """Why that engine runs (who asked, or what "auto" found)."""
    def areas(self) -> dict[str, int | bool] | None:
        """The protect engine's memory areas, or None under userfaultfd."""
    @property
    def serves_kernel_faults(self) -> bool:
        """Whether f.write(m) and os.write(fd, m) wait for unmapped pages."""
    @property
    def delivery(self) -> _Delivery:
        """"handler" or "signal"."""
    @property
    def page_size(self) -> int:
        """The page size of objects opened without one: 4096 or 2097152."""
    @property
    def disk_cache(self) -> pathlib.Path | None:
        """The disk cache's directory (disk_cache= or FAULTMAP_CACHE_DIR)."""
    @property
    def disk_cache_max(self) -> int | None:
        """The most bytes the disk cache keeps, or None."""

class Mapping(Buffer):
    """A mapped object: reads (and, if writable, writes) like memory.

    memoryview(m) is zero-copy; m.array(dtype) is a zero-copy numpy array.
    """

    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, key: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, key: slice) -> bytes: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...
    def array(
        self,
        dtype: numpy.typing.DTypeLike,
        shape: int | Sequence[int] | None = None,
        offset: int = 0,
    ) -> numpy.ndarray[Any, Any]:
        """A zero-copy numpy array over the mapping from byte offset."""
    def advise(self, advice: _Advice, start: int = 0, stop: int | None = None) -> None:
        """Tells faultmap how bytes [start, stop) will be used (madvise)."""
    def populate(self, start: int = 0, stop: int | None = None) -> None:
        """Reads bytes [start, stop) in and maps them, for a system call."""
    def prefetch(self, start: int = 0, stop: int | None = None) -> None:
        """Starts reading bytes [start, stop) now, and returns."""
    def prefetch_ranges(
        self,
        ranges: Sequence[tuple[int, int]] | Sequence[int] | Any,
        lengths: Sequence[int] | Any | None = None,
        *,
        wait: bool = False,
    ) -> dict[str, int]:
        """Starts reading many byte ranges at once, merged into few
        requests in flight together: (start, length) pairs (or an (N, 2)
        array), or starts with lengths (lists or numpy arrays). With
        wait=True, returns once the reads it started have ended (a page
        that cannot be read raises OSError). Returns {"requests", "pages",
        "hole_pages"}."""
    def invalidate(self, start: int = 0, stop: int | None = None) -> int:
        """Drops the cached pages of bytes [start, stop); returns how many."""
    def flush(self, start: int = 0, stop: int | None = None) -> int:
        """Writes dirty pages of bytes [start, stop) back; returns how many."""
    def stats(self) -> dict[str, int]:
        """This mapping's counters (pgfault, pgmajfault, io_count, ...)."""
    def ra_stats(self) -> dict[str, Any]:
        """This mapping's readahead table."""
    def disk_cache_stats(self) -> dict[str, int | str | None] | None:
        """What the object's disk cache did since it was opened:
        {"disk_bytes", "network_bytes", "written_bytes", "waits",
        "problems", "first_problem"}, or None when the object is not read
        through a disk cache."""
    def save_trace(self, path: str | os.PathLike[str]) -> dict[str, int]:
        """Writes the access trace recorded so far (record_trace=True);
        returns {"pages", "runs", "bytes"}."""
    def replay_progress(self) -> dict[str, int | bool] | None:
        """Where the replay of a trace stands (replay_trace=...):
        {"pages", "replayed", "used", "waiting", "done"}, or None."""
    def memory(self) -> dict[str, int | None]:
        """The object's memory: {"budget", "cached", "peak", "active"}."""
    def io_errors(self) -> list[dict[str, Any]]:
        """The object's store failures, newest last."""
    def close(self) -> None:
        """Unmaps it; BufferError while memoryviews or arrays of it live."""
    @property
    def closed(self) -> bool: ...
    @property
    def writable(self) -> bool: ...
    @property
    def sharing(self) -> Literal["private", "owner", "joined"]: ...
    @property
    def sharing_error(self) -> str | None: ...
    @property
    def name(self) -> str: ...
    @property
    def page_size(self) -> int:
        """The object's page size in bytes: 4096 or 2097152."""
    @property
    def fault_around_order(self) -> int | Literal["auto"]: ...
    @fault_around_order.setter
    def fault_around_order(self, order: int | Literal["auto"]) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]: ...
