#!/usr/bin/env python3
"""A Google Cloud Storage stand-in for faultmap's tests and benchmarks: the
XML API's object reads and writes, served from a folder.

Why it exists. The `object_store` crate (0.14, feature `gcp`) reads an object
through GCS's XML API: `HEAD {base}/{bucket}/{key}` for its metadata (it
requires ETag, Last-Modified and Content-Length, and keeps
`x-goog-generation` as the version), then `GET` of the same URL with
`Range: bytes=a-b`, `If-Match: <etag>` and `?generation=<version>`, wanting
206 with Content-Range, and 412 when the ETag no longer matches. Its key is
percent-encoded whole, `/` included (`a/b` is sent as `a%2Fb`). The usual
emulator, fake-gcs-server (v1.56.1, memory backend, `-public-host
127.0.0.1`), answers HEAD, ranged GETs, 416 and `generation` correctly, but:
  - it ignores `If-Match` (a wrong ETag gets 206 with the bytes, not 412)
    and `If-None-Match` (200, not 304);
  - it refuses the XML API's upload (`PUT {base}/{bucket}/{key}`, which
    `object_store`'s `put` sends) with 400 "invalid uploadType";
  - its memory backend holds every object in memory (a 1 GiB upload took
    its RSS to 2.7 GiB), and it needs a Go build.
This stub does what faultmap needs and nothing more, from files on disk.

What it serves, on one folder ROOT whose subfolders are the buckets (like
versitygw's posix backend: a file copied into ROOT/BUCKET/KEY is the object
BUCKET/KEY at once):
  HEAD/GET /BUCKET/KEY   Range (one range: 206 + Content-Range; 416 with
                         `Content-Range: bytes */SIZE` past the end; a range
                         it cannot parse, or several, gets the whole object,
                         as GCS does), ETag, Last-Modified,
                         x-goog-generation, x-goog-metageneration,
                         x-goog-stored-content-length; `?generation=N` other
                         than the current one is 404 (a bucket without
                         versioning); If-Match / If-Unmodified-Since /
                         x-goog-if-generation-match -> 412, If-None-Match /
                         If-Modified-Since -> 304. The body goes out by
                         sendfile.
  PUT /BUCKET/KEY        upload (Content-Length or chunked), written to a
                         temporary file and renamed into place; honours
                         x-goog-if-generation-match (0: only if absent).
  DELETE /BUCKET/KEY     204.
  PUT /BUCKET            create the bucket (409 BucketAlreadyOwnedByYou if
                         it exists).
  GET /BUCKET?list-type=2  a ListBucketResult (prefix, delimiter, max-keys,
                         continuation-token, start-after), as `object_store`
                         lists.
  GET /                  the buckets (also the readiness check).
Errors are GCS's XML `<Error><Code>NoSuchKey</Code>...` bodies. Anything
else (multipart uploads, the JSON API, ACLs) is 501 NotImplemented. No
authentication: `object_store` sends none with `disable_oauth: true`.

The ETag is not an MD5 (that would read the whole file for each HEAD): it
is made of the file's inode, size and modification time, which change when
the object is replaced; the generation is the modification time in
microseconds, as GCS's generations are.

Usage: gcs-stub.py --root DIR --port PORT [--host 127.0.0.1] [--verbose]
Stdlib only. TERM stops it.
"""

import argparse
import contextlib
import datetime
import email.utils
import errno
import html
import os
import shutil
import stat
import sys
import tempfile
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 1 << 20
UPLOADS = ".uploads"  # temporary files of PUTs, in ROOT (not a bucket name)


class Obj:
    """A file's object metadata."""

    def __init__(self, path, st):
        self.path = path
        self.size = st.st_size
        self.generation = st.st_mtime_ns // 1000
        self.etag = '"%x-%x-%x"' % (st.st_ino, st.st_size, st.st_mtime_ns)
        self.mtime = st.st_mtime

    def last_modified(self):
        return email.utils.formatdate(self.mtime, usegmt=True)

    def iso_mtime(self):
        t = datetime.datetime.fromtimestamp(self.mtime, datetime.timezone.utc)
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (t.microsecond // 1000)


def xml_escape(s):
    return html.escape(s, quote=False)


def parse_http_date(value):
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def etag_matches(header, etag):
    """Whether an If-Match / If-None-Match list names ETAG (strong)."""
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*" or tag == etag:
            return True
    return False


def parse_range(header, size):
    """(start, end) inclusive, "unsatisfiable", or None for the whole object."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    spec = header[len("bytes="):].strip()
    first, sep, last = spec.partition("-")
    if not sep:
        return None
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                return "unsatisfiable"
            return (max(size - n, 0), size - 1) if size else "unsatisfiable"
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start >= size:  # GCS: 416 only for a start past the end
        return "unsatisfiable"
    if end < start:
        return None
    return start, min(end, size - 1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as GCS

    def version_string(self):
        return "faultmap-gcs-stub"

    # ---- plumbing ----------------------------------------------------------

    def log_message(self, fmt, *args):
        if self.server.verbose:
            super().log_message(fmt, *args)

    def split(self):
        """(bucket, key, query) of the request; key may be ''."""
        raw, _, query = self.path.partition("?")
        path = urllib.parse.unquote(raw)
        bucket, _, key = path.lstrip("/").partition("/")
        return bucket, key, urllib.parse.parse_qs(query, keep_blank_values=True)

    def resolve(self, bucket, key=""):
        """The file of BUCKET/KEY, or None for a name that would leave ROOT."""
        if not bucket or bucket.startswith(".") or "/" in bucket or "\0" in bucket:
            return None
        parts = key.split("/") if key else []
        if any(p in ("", ".", "..") for p in parts) or "\0" in key:
            return None
        return os.path.join(self.server.root, bucket, *parts)

    def send_xml(self, status, body, head_only=False, headers=()):
        data = ('<?xml version="1.0" encoding="UTF-8"?>' + body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if not head_only:
            self.wfile.write(data)

    def error(self, status, code, message, headers=()):
        self.send_xml(
            status,
            "<Error><Code>%s</Code><Message>%s</Message></Error>"
            % (code, xml_escape(message)),
            head_only=self.command == "HEAD",
            headers=headers,
        )

    def drain(self):
        """Reads and drops a request body we do not use (keep-alive)."""
        n = int(self.headers.get("Content-Length") or 0)
        while n > 0:
            got = self.rfile.read(min(n, CHUNK))
            if not got:
                break
            n -= len(got)

    def lookup(self, path):
        try:
            st = os.stat(path)
        except OSError:
            return None
        return Obj(path, st) if stat.S_ISREG(st.st_mode) else None

    # ---- verbs -------------------------------------------------------------

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        bucket, key, query = self.split()
        if not bucket:
            return self.list_buckets()
        if not key:
            return self.list_objects(bucket, query)
        path = self.resolve(bucket, key)
        if path is None:
            return self.error(400, "InvalidArgument", "Invalid object name.")
        if not os.path.isdir(os.path.join(self.server.root, bucket)):
            return self.error(404, "NoSuchBucket", "The specified bucket does not exist.")
        # The file is opened first and its metadata read from the open
        # file: a rename over it meanwhile can never pair the old ETag with
        # the new bytes.
        try:
            f = open(path, "rb")
        except OSError:
            f = None
        with contextlib.ExitStack() as stack:
            if f is not None:
                stack.enter_context(f)
            return self.get_open(path, f, query)

    def get_open(self, path, f, query):
        """GET or HEAD of the object whose file is open as `f` (None: none)."""
        obj = None
        if f is not None:
            st = os.fstat(f.fileno())
            obj = Obj(path, st) if stat.S_ISREG(st.st_mode) else None
        gen = query.get("generation", [None])[0]
        if obj is None or (gen is not None and gen != str(obj.generation)):
            return self.error(404, "NoSuchKey", "The specified key does not exist.")
        if not self.preconditions(obj):
            return
        rng = parse_range(self.headers.get("Range"), obj.size)
        if rng == "unsatisfiable":
            return self.error(
                416,
                "InvalidRange",
                "The requested range cannot be satisfied.",
                headers=[("Content-Range", "bytes */%d" % obj.size)],
            )
        if rng is None:
            status, start, length = 200, 0, obj.size
        else:
            status, start, length = 206, rng[0], rng[1] - rng[0] + 1
        self.send_response(status)
        self.object_headers(obj)
        self.send_header("Content-Length", str(length))
        if status == 206:
            self.send_header(
                "Content-Range", "bytes %d-%d/%d" % (start, start + length - 1, obj.size)
            )
        self.end_headers()
        if self.command == "GET" and length:
            sent = self.connection.sendfile(f, start, length)
            if sent != length:  # the file shrank under us: close, never pad
                self.close_connection = True

    def object_headers(self, obj):
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", obj.etag)
        self.send_header("Last-Modified", obj.last_modified())
        self.send_header("x-goog-generation", str(obj.generation))
        self.send_header("x-goog-metageneration", "1")
        self.send_header("x-goog-stored-content-length", str(obj.size))
        self.send_header("x-goog-stored-content-encoding", "identity")
        self.send_header("x-goog-storage-class", "STANDARD")

    def preconditions(self, obj):
        """Sends 412/304 and returns False when a condition fails."""
        h = self.headers
        failed = False
        if h.get("If-Match") is not None:
            failed = not etag_matches(h["If-Match"], obj.etag)
        elif h.get("If-Unmodified-Since") is not None:
            t = parse_http_date(h["If-Unmodified-Since"])
            failed = t is not None and int(obj.mtime) > t
        gm = h.get("x-goog-if-generation-match")
        if gm is not None and gm != str(obj.generation):
            failed = True
        if failed:
            self.error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold.")
            return False
        not_modified = False
        if h.get("If-None-Match") is not None:
            not_modified = etag_matches(h["If-None-Match"], obj.etag)
        elif h.get("If-Modified-Since") is not None:
            t = parse_http_date(h["If-Modified-Since"])
            not_modified = t is not None and int(obj.mtime) <= t
        if not_modified:
            self.send_response(304)
            self.send_header("ETag", obj.etag)
            self.send_header("Last-Modified", obj.last_modified())
            self.send_header("x-goog-generation", str(obj.generation))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        return True

    def do_PUT(self):
        bucket, key, query = self.split()
        if "uploadId" in query or "partNumber" in query or "x-goog-copy-source" in self.headers:
            self.drain()
            return self.error(501, "NotImplemented", "Not implemented by gcs-stub.")
        if not key:
            return self.create_bucket(bucket)
        path = self.resolve(bucket, key)
        if path is None:
            self.drain()
            return self.error(400, "InvalidArgument", "Invalid object name.")
        bucket_dir = os.path.join(self.server.root, bucket)
        if not os.path.isdir(bucket_dir):
            self.drain()
            return self.error(404, "NoSuchBucket", "The specified bucket does not exist.")
        gm = self.headers.get("x-goog-if-generation-match")
        if gm is not None:
            cur = self.lookup(path)
            if (gm == "0" and cur is not None) or (
                gm != "0" and (cur is None or gm != str(cur.generation))
            ):
                self.drain()
                return self.error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold.")
        tmpdir = os.path.join(self.server.root, UPLOADS)
        os.makedirs(tmpdir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=tmpdir)
        try:
            with os.fdopen(fd, "wb") as out:
                if not self.copy_body(out):
                    self.close_connection = True
                    return self.error(400, "IncompleteBody", "The request body is shorter than announced.")
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            except OSError as e:
                return self.error(409, "InvalidArgument", "Cannot create the object: %s" % e.strerror)
            if os.path.isdir(path):
                return self.error(409, "InvalidArgument", "A prefix of that name holds objects.")
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
            tmp = None
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        obj = self.lookup(path)
        self.send_response(200)
        self.send_header("ETag", obj.etag)
        self.send_header("x-goog-generation", str(obj.generation))
        self.send_header("x-goog-metageneration", "1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def copy_body(self, out):
        """Copies the request body to OUT; False if it ended early."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                line = self.rfile.readline(1024)
                if not line:
                    return False
                try:
                    n = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    return False
                if n == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return True
                if not self.copy_n(out, n):
                    return False
                self.rfile.readline(16)  # the chunk's CRLF
        return self.copy_n(out, int(self.headers.get("Content-Length") or 0))

    def copy_n(self, out, n):
        """Copies the next `n` bytes of the request body to `out`; False if
        the body ends before."""
        while n > 0:
            got = self.rfile.read(min(n, CHUNK))
            if not got:
                return False
            out.write(got)
            n -= len(got)
        return True

    def do_DELETE(self):
        bucket, key, _ = self.split()
        path = self.resolve(bucket, key) if key else None
        if path is None:
            return self.error(501, "NotImplemented", "Not implemented by gcs-stub.")
        if self.lookup(path) is None:
            return self.error(404, "NoSuchKey", "The specified key does not exist.")
        os.unlink(path)
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        self.drain()
        self.error(501, "NotImplemented", "Not implemented by gcs-stub.")

    do_PATCH = do_POST

    # ---- buckets -----------------------------------------------------------

    def create_bucket(self, bucket):
        self.drain()
        path = self.resolve(bucket)
        if path is None:
            return self.error(400, "InvalidBucketName", "The specified bucket is not valid.")
        try:
            os.mkdir(path)
        except FileExistsError:
            return self.error(409, "BucketAlreadyOwnedByYou", "Your previous request to create the named bucket succeeded and you already own it.")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def list_buckets(self):
        names = sorted(
            n for n in os.listdir(self.server.root)
            if not n.startswith(".") and os.path.isdir(os.path.join(self.server.root, n))
        )
        self.send_xml(
            200,
            "<ListAllMyBucketsResult><Buckets>%s</Buckets></ListAllMyBucketsResult>"
            % "".join("<Bucket><Name>%s</Name></Bucket>" % xml_escape(n) for n in names),
            head_only=self.command == "HEAD",
        )

    def list_objects(self, bucket, query):
        top = self.resolve(bucket)
        if top is None or not os.path.isdir(top):
            return self.error(404, "NoSuchBucket", "The specified bucket does not exist.")
        q = {k: v[0] for k, v in query.items()}
        prefix = q.get("prefix", "")
        delimiter = q.get("delimiter", "")
        after = q.get("continuation-token") or q.get("start-after") or ""
        try:
            max_keys = min(int(q.get("max-keys", 1000)), 1000)
        except ValueError:
            return self.error(400, "InvalidArgument", "Invalid max-keys.")
        keys = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = os.path.relpath(dirpath, top)
            for name in filenames:
                key = name if rel == "." else rel.replace(os.sep, "/") + "/" + name
                if key.startswith(prefix):
                    keys.append(key)
        keys.sort()
        # Objects and common prefixes in key order, after the token; a page
        # that stops early hands its last name on as the next token.
        entries, prefixes, token = [], [], None
        for key in keys:
            name = key
            if delimiter:
                cut = key.find(delimiter, len(prefix))
                if cut >= 0:
                    name = key[: cut + len(delimiter)]
            if name <= after or (prefixes and prefixes[-1] == name):
                continue
            if len(entries) + len(prefixes) >= max_keys:
                token = max(entries[-1:] + prefixes[-1:])
                break
            (prefixes if name != key else entries).append(name)
        body = ["<ListBucketResult><Name>%s</Name><Prefix>%s</Prefix><KeyCount>%d</KeyCount>"
                "<MaxKeys>%d</MaxKeys><IsTruncated>%s</IsTruncated>"
                % (xml_escape(bucket), xml_escape(prefix), len(entries) + len(prefixes), max_keys,
                   "true" if token else "false")]
        if delimiter:
            body.append("<Delimiter>%s</Delimiter>" % xml_escape(delimiter))
        if token:
            body.append("<NextContinuationToken>%s</NextContinuationToken>" % xml_escape(token))
        for key in entries:
            obj = self.lookup(os.path.join(top, *key.split("/")))
            if obj is None:
                continue
            body.append(
                "<Contents><Key>%s</Key><Generation>%d</Generation><LastModified>%s</LastModified>"
                "<ETag>%s</ETag><Size>%d</Size></Contents>"
                % (xml_escape(key), obj.generation, obj.iso_mtime(), xml_escape(obj.etag), obj.size)
            )
        for p in prefixes:
            body.append("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % xml_escape(p))
        body.append("</ListBucketResult>")
        self.send_xml(200, "".join(body), head_only=self.command == "HEAD")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def main():
    ap = argparse.ArgumentParser(description="A GCS XML-API stand-in serving a folder.")
    ap.add_argument("--root", required=True, help="folder whose subfolders are the buckets")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--verbose", action="store_true", help="log each request to stderr")
    args = ap.parse_args()
    os.makedirs(args.root, exist_ok=True)
    shutil.rmtree(os.path.join(args.root, UPLOADS), ignore_errors=True)  # a crashed run's leftovers
    try:
        server = Server((args.host, args.port), Handler)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            print("gcs-stub: %s:%d: address already in use" % (args.host, args.port), file=sys.stderr)
            sys.exit(1)
        raise
    server.root = os.path.abspath(args.root)
    server.verbose = args.verbose
    print("gcs-stub: serving %s on http://%s:%d" % (server.root, args.host, args.port), file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
