"""faultmap: map files, HTTP and S3 objects as memory.

A mapping reads like ``bytes`` and exports the buffer protocol, so
``memoryview(m)`` and ``m.array(numpy.float32)`` see the object's bytes in
place, with no copy. Pages come in on their first touch, through
faultmap's user-space pager (Linux userfaultfd) with the kernel's
fault-around and readahead, under a memory budget of your choosing::

    import faultmap, numpy

    with faultmap.open("s3://bucket/weights.bin") as m:
        w = m.array(numpy.float16, shape=(4096, 4096))
        print(w[17].sum())

See ``help(faultmap.open)``, ``help(faultmap.Mapping)`` and
``help(faultmap.Pager)``.
"""

from ._faultmap import PAGE_SIZE, Mapping, Pager, __version__, open

__all__ = ["open", "Mapping", "Pager", "PAGE_SIZE", "__version__"]
