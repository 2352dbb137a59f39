/* The C API from C: maps a file and checks its bytes against read(2),
 * writes through a writable mapping and reads the file back, maps a file
 * in 2 MiB pages (FM_HUGE_PAGES), checks that every misuse is an error
 * code with a message, never a crash, and that fm_config's io_timeout_ms
 * bounds the open of a server that never answers, that a forked
 * child reads and writes the mappings it inherited (served by the parent),
 * and that an unrelated process (this program again, exec'd) with
 * FM_SHARED_ON joins the cache of the first; that FM_ENGINE_PROTECT reads,
 * writes and populates for a system call, and that FM_ENGINE_AUTO picks it
 * where userfaultfd is refused (scripts/nouffd, as a container's seccomp
 * profile refuses it); and that fm_config.disk_cache keeps an HTTP
 * object (served by the test's own server) on disk for a second pager,
 * refuses a directory others may write to, and is ignored in an older
 * fm_config.
 * Built and run by scripts/test-all (see scripts/c-tests):
 *
 *   capi_test SCRATCH_DIR
 *
 * The 2 MiB pages come from the kernel's pool, which the test grows
 * through /proc/sys/vm/nr_hugepages (as root, which CI is) and gives back
 * when it ends; where the pool cannot be grown the test fails, loudly: it
 * is not skipped. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "faultmap.h"

static int failures = 0;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            failures++;                                                    \
            fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, " (last error: %s)\n", fm_last_error());       \
        }                                                                  \
    } while (0)

/* Writes `len` pattern bytes to `path`; returns them (malloc'd). */
static uint8_t *make_file(const char *path, size_t len) {
    uint8_t *data = malloc(len ? len : 1);
    uint64_t x = 0x9E3779B97F4A7C15u;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        data[i] = (uint8_t)x;
    }
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0 || write(fd, data, len) != (ssize_t)len) {
        perror(path);
        exit(2);
    }
    close(fd);
    return data;
}

#define NR_HUGEPAGES "/proc/sys/vm/nr_hugepages"
#define FREE_HUGEPAGES "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"
#define HUGE ((size_t)2 * 1024 * 1024)

/* The number in the file `path`; exits (the test fails) if there is none. */
static long read_number(const char *path) {
    FILE *f = fopen(path, "r");
    long n = -1;
    if (!f || fscanf(f, "%ld", &n) != 1 || n < 0) {
        fprintf(stderr, "FAILED: cannot read a number from %s\n", path);
        exit(1);
    }
    fclose(f);
    return n;
}

/* Writes `n` to `path`; 0, or -1 with errno set. */
static int write_number(const char *path, long n) {
    char text[32];
    int len = snprintf(text, sizeof text, "%ld\n", n);
    int fd = open(path, O_WRONLY);
    if (fd < 0)
        return -1;
    ssize_t done = write(fd, text, (size_t)len);
    int saved = errno;
    close(fd);
    errno = saved;
    return done == len ? 0 : -1;
}

/* The lock file that every suite of the project and `faultmap bench`
 * hold while they change the pool: each grows it by what it needs and
 * takes as much out again, never writing back a size read earlier. Held
 * from the first grow to the end of the process. */
#define POOL_LOCK "/tmp/faultmap-hugepages.lock"
static int pool_lock = -1;

/* Huge pages this test added to the pool, taken out again at exit
 * whichever way the test ends. */
static long pool_added = 0;

static void restore_pool(void) {
    if (pool_added == 0)
        return;
    /* Read without read_number, which exits: this runs from atexit. */
    long now = -1;
    FILE *f = fopen(NR_HUGEPAGES, "r");
    if (!f || fscanf(f, "%ld", &now) != 1 || now < 0) {
        failures++;
        fprintf(stderr, "FAILED: cannot read %s to give the huge pages back\n", NR_HUGEPAGES);
        if (f)
            fclose(f);
        pool_added = 0;
        return;
    }
    fclose(f);
    long back = now > pool_added ? now - pool_added : 0;
    if (write_number(NR_HUGEPAGES, back) != 0) {
        failures++;
        fprintf(stderr, "FAILED: cannot give the huge pages back (%s = %ld): %s\n",
                NR_HUGEPAGES, back, strerror(errno));
    }
    pool_added = 0;
}

/* Grows the pool by `extra` huge pages, under the pool's lock; exits (the
 * test fails) if it cannot. */
static void grow_pool(long extra) {
    if (pool_lock < 0) {
        /* Read-only if it exists (flock needs no more, and a file another
         * user made stays usable), else made. */
        pool_lock = open(POOL_LOCK, O_RDONLY | O_CLOEXEC);
        if (pool_lock < 0 && errno == ENOENT)
            pool_lock = open(POOL_LOCK, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        if (pool_lock < 0 || flock(pool_lock, LOCK_EX) != 0) {
            fprintf(stderr, "FAILED: cannot lock %s: %s\n", POOL_LOCK, strerror(errno));
            exit(1);
        }
        atexit(restore_pool);
    }
    long old = read_number(NR_HUGEPAGES);
    if (write_number(NR_HUGEPAGES, old + extra) != 0) {
        fprintf(stderr,
                "FAILED: cannot grow the pool of huge pages (%s to %ld: %s); "
                "this test needs root\n",
                NR_HUGEPAGES, old + extra, strerror(errno));
        exit(1);
    }
    /* What the kernel added (perhaps less than asked) goes back. */
    long now = read_number(NR_HUGEPAGES);
    pool_added += now > old ? now - old : 0;
    if (now < old + extra) {
        fprintf(stderr, "FAILED: the kernel gave %ld huge pages of %ld asked\n", now,
                old + extra);
        exit(1);
    }
}

/* 2 MiB pages: a mapping in huge pages reads as the file, one fault per
 * 2 MiB page; a trace of 4 KiB pages (`trace`, recorded on `traced`) is
 * not replayed in 2 MiB ones; an empty pool refuses with ENOMEM and says
 * how to grow it; nothing falls back to 4 KiB pages. */
static void huge_pages(const char *dir, const char *traced, const char *trace) {
    if (geteuid() != 0) {
        printf("capi_test: 2 MiB pages not run: growing vm.nr_hugepages needs root "
               "(scripts/test-all runs this test as root too)\n");
        return;
    }
    char path[4096], big[4096];
    snprintf(path, sizeof path, "%s/capi-huge.bin", dir);
    snprintf(big, sizeof big, "%s/capi-huge-big.bin", dir);
    /* 3 pages and a tail of 100 bytes: 4 huge pages, 4 more for the part
     * mapped beside it (an object of its own, whose cache is the whole
     * file's), and 2 for the traced file (3 MiB and a bit), opened before
     * its trace is refused. */
    const size_t len = 3 * HUGE + 100;
    uint8_t *data = make_file(path, len);
    grow_pool(10);

    fm_pager *pager = fm_pager_new(NULL);
    CHECK(pager != NULL, "fm_pager_new");
    if (!pager)
        exit(1);
    fm_mapping *m = fm_map(pager, path, 0, 0, FM_HUGE_PAGES);
    CHECK(m != NULL, "fm_map FM_HUGE_PAGES");
    if (m) {
        CHECK(fm_mapping_page_size(m) == HUGE, "page size %zu", fm_mapping_page_size(m));
        CHECK(fm_mapping_len(m) == len, "len %zu", fm_mapping_len(m));
        /* One byte of every 4 KiB page first: 4 faults map it all. */
        const uint8_t *p = fm_mapping_ptr(m);
        for (size_t i = 0; i < len; i += 4096)
            CHECK(p[i] == data[i], "byte %zu", i);
        fm_stats stats;
        CHECK(fm_mapping_stats(m, &stats) == 0 && stats.pgfault == 4,
              "one fault per 2 MiB page: pgfault %llu", (unsigned long long)stats.pgfault);
        CHECK(memcmp(p, data, len) == 0, "the bytes of 2 MiB pages differ");
    }
    /* An unaligned part: it maps from its page, and reads as the file. */
    const size_t start = HUGE + 4097;
    fm_mapping *part = fm_map(pager, path, start, 10000, FM_HUGE_PAGES | FM_READAHEAD_OFF);
    CHECK(part != NULL && fm_mapping_len(part) == 10000, "a part in 2 MiB pages");
    if (part) {
        CHECK(fm_mapping_page_size(part) == HUGE, "the part's page size");
        CHECK(memcmp(fm_mapping_ptr(part), data + start, 10000) == 0,
              "the part's bytes differ");
        fm_unmap(part);
    }
    fm_unmap(m);
    CHECK(fm_map_replay(pager, traced, 0, 0, FM_HUGE_PAGES, trace) == NULL &&
              fm_last_errno() == EINVAL && strstr(fm_last_error(), "2 MiB pages") != NULL,
          "a trace of 4 KiB pages replayed in 2 MiB ones: errno %d", fm_last_errno());
    restore_pool();

    /* The pool as it was (empty on a fresh machine) cannot hold an object
     * of 3 more huge pages than it has free (a sparse file: nothing is
     * read before the refusal). */
    long pages = read_number(FREE_HUGEPAGES) + 3;
    int fd = open(big, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)pages * (off_t)HUGE) != 0) {
        perror(big);
        exit(2);
    }
    close(fd);
    CHECK(fm_map(pager, big, 0, 0, FM_HUGE_PAGES) == NULL && fm_last_errno() == ENOMEM,
          "a pool too small: errno %d", fm_last_errno());
    char needs[64];
    snprintf(needs, sizeof needs, "needs %ld huge pages", pages);
    CHECK(strstr(fm_last_error(), "vm.nr_hugepages") != NULL &&
              strstr(fm_last_error(), needs) != NULL,
          "says how many, and what to raise");
    /* Without the flag: 4 KiB pages, as before. */
    fm_mapping *base = fm_map(pager, big, 0, 0, 0);
    CHECK(base != NULL && fm_mapping_page_size(base) == 4096, "4 KiB pages without the flag");
    fm_unmap(base);
    CHECK(fm_mapping_page_size(NULL) == 0 && fm_last_errno() == EINVAL,
          "fm_mapping_page_size(NULL)");
    fm_pager_free(pager);
    unlink(big);
    unlink(path);
    free(data);
}

/* A TCP listener on 127.0.0.1 that never accepts: connections complete
 * (the kernel's backlog) and then nothing answers. Returns the socket and
 * puts its port in *port; -1 on failure. */
static int silent_listener(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(addr.sin_port);
    return fd;
}

/* fm_config: its size is checked, and io_timeout_ms is the deadline of
 * the whole open of a server that never answers (a timeout at open is not
 * retried): the open fails with ETIMEDOUT, and the message names the URL
 * and that deadline. */
static void config_fields(void) {
    fm_config zero = {0};
    CHECK(fm_pager_new(&zero) == NULL && fm_last_errno() == EINVAL &&
              strstr(fm_last_error(), "size") != NULL,
          "an fm_config without its size: errno %d", fm_last_errno());
    struct {
        fm_config config;
        uint64_t future;
    } newer = {{.size = sizeof newer}, 0};
    fm_pager *p = fm_pager_new(&newer.config);
    CHECK(p != NULL, "a larger fm_config whose unknown fields are zero");
    fm_pager_free(p);
    newer.future = 1;
    CHECK(fm_pager_new(&newer.config) == NULL && fm_last_errno() == E2BIG,
          "a larger fm_config with an unknown field set: errno %d", fm_last_errno());
    fm_config first = {.size = 32}; /* the first fm_config ended at io_timeout_ms */
    p = fm_pager_new(&first);
    CHECK(p != NULL, "the first fm_config (32 bytes) is still served");
    fm_pager_free(p);
    fm_config bad_shared = {.size = sizeof bad_shared, .shared = 7};
    CHECK(fm_pager_new(&bad_shared) == NULL && fm_last_errno() == EINVAL,
          "shared 7: errno %d", fm_last_errno());
    fm_config too_many = {.size = sizeof too_many, .io_retries = 17};
    CHECK(fm_pager_new(&too_many) == NULL && fm_last_errno() == EINVAL,
          "io_retries 17: errno %d", fm_last_errno());

    int port = 0;
    int listener = silent_listener(&port);
    CHECK(listener >= 0, "a listener on 127.0.0.1");
    if (listener < 0)
        return;
    fm_config quick = {.size = sizeof quick, .io_timeout_ms = 500, .io_retries = 3};
    fm_pager *pager = fm_pager_new(&quick);
    CHECK(pager != NULL, "a pager with io_timeout_ms");
    if (pager) {
        char url[64];
        snprintf(url, sizeof url, "http://127.0.0.1:%d/object.bin", port);
        fm_mapping *m = fm_map(pager, url, 0, 0, 0);
        CHECK(m == NULL && fm_last_errno() == ETIMEDOUT, "a silent server: errno %d",
              fm_last_errno());
        CHECK(strstr(fm_last_error(), url) != NULL, "the message names the URL");
        CHECK(strstr(fm_last_error(), "open deadline of 500ms") != NULL,
              "the message names io_timeout_ms as the deadline");
        fm_unmap(m);
        fm_pager_free(pager);
    }
    close(listener);
}

/* A child of fork() reads a mapping made before the fork (the parent
 * serves it from its cache: the file is read once), and writes a writable
 * one, which the parent sees and writes back. */
static void fork_children(fm_pager *pager, const char *path, const uint8_t *data, size_t len) {
    fm_mapping *m = fm_map(pager, path, 0, 0, 0);
    fm_mapping *w = fm_map(pager, path, 0, 0, FM_WRITABLE);
    CHECK(m != NULL && w != NULL, "fm_map before the fork");
    if (!m || !w)
        return;
    const uint8_t *p = fm_mapping_ptr(m);
    uint8_t *q = (uint8_t *)fm_mapping_ptr(w);
    CHECK(p[0] == data[0], "the parent reads the first page");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int same = memcmp(p, data, len) == 0;
        memcpy(q + 8192, "C-CHILD!", 8);
        _exit(same ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child read the bytes: status %#x",
          status);
    CHECK(memcmp(q + 8192, "C-CHILD!", 8) == 0, "the parent sees the child's write");
    CHECK(fm_flush(w, 0, 0) >= 0, "fm_flush");
    fm_stats stats;
    CHECK(fm_mapping_stats(m, &stats) == 0 && stats.io_bytes <= len + 4096,
          "the file read once: %llu bytes for %zu", (unsigned long long)stats.io_bytes, len);
    uint8_t back[8];
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && pread(fd, back, 8, 8192) == 8 && memcmp(back, "C-CHILD!", 8) == 0,
          "the child's write is in the file");
    if (fd >= 0)
        close(fd);
    /* Put the file back as it was for the rest of the test. */
    memcpy(q + 8192, data + 8192, 8);
    CHECK(fm_flush(w, 0, 0) >= 0, "fm_flush");
    fm_unmap(w);
    fm_unmap(m);
}

/* The joiner's side of unrelated_processes (this program, exec'd with
 * --joiner PATH): maps PATH with sharing on, must join, and must read the
 * file's bytes. Returns the exit status. */
static int joiner(const char *path) {
    fm_config config = {.size = sizeof config, .shared = FM_SHARED_ON};
    fm_pager *pager = fm_pager_new(&config);
    CHECK(pager != NULL, "the joiner's pager");
    if (!pager)
        return 1;
    fm_mapping *m = fm_map(pager, path, 0, 0, 0);
    CHECK(m != NULL, "the joiner's fm_map");
    if (m) {
        CHECK(fm_mapping_sharing(m) == FM_SHARING_JOINED, "the joiner joined: %d",
              fm_mapping_sharing(m));
        size_t len = fm_mapping_len(m);
        uint8_t *want = malloc(len);
        int fd = open(path, O_RDONLY);
        CHECK(fd >= 0 && pread(fd, want, len, 0) == (ssize_t)len, "reading %s", path);
        if (fd >= 0)
            close(fd);
        CHECK(memcmp(fm_mapping_ptr(m), want, len) == 0, "the joiner's bytes differ");
        free(want);
        fm_unmap(m);
    }
    fm_pager_free(pager);
    return failures ? 1 : 0;
}

/* Two unrelated processes with FM_SHARED_ON: this one maps the file first
 * and owns its cache; the joiner (exec'd: it inherits nothing) reads all
 * of it through this process, which then finds every page cached. */
static void unrelated_processes(const char *self, const char *scratch, const char *path,
                                const uint8_t *data, size_t len) {
    char meet[4096];
    snprintf(meet, sizeof meet, "%s/meet", scratch);
    CHECK(mkdir(meet, 0700) == 0, "mkdir %s: %s", meet, strerror(errno));
    setenv("FAULTMAP_SHARED_DIR", meet, 1);
    fm_config config = {.size = sizeof config, .shared = FM_SHARED_ON};
    fm_pager *pager = fm_pager_new(&config);
    CHECK(pager != NULL, "the owner's pager");
    if (!pager)
        return;
    fm_mapping *m = fm_map(pager, path, 0, 0, 0);
    CHECK(m != NULL, "the owner's fm_map");
    if (m) {
        CHECK(fm_mapping_sharing(m) == FM_SHARING_OWNER, "the first process owns the cache: %d",
              fm_mapping_sharing(m));
        pid_t pid = fork();
        if (pid == 0) {
            execl(self, self, "--joiner", path, (char *)NULL);
            _exit(127);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the joiner: status %#x", status);
        CHECK(memcmp(fm_mapping_ptr(m), data, len) == 0, "the owner's bytes differ");
        fm_stats stats;
        CHECK(fm_mapping_stats(m, &stats) == 0 && stats.io_bytes == 0,
              "the joiner's reads filled the owner's cache: the owner read %llu bytes",
              (unsigned long long)stats.io_bytes);
        fm_unmap(m);
    }
    fm_pager_free(pager);
    unsetenv("FAULTMAP_SHARED_DIR");
}

/* USERFAULTFD_IOC_NEW on /dev/userfaultfd: a new userfaultfd, or -1. */
static long ioctl_new(int dev) {
    return ioctl(dev, 0xAA00, O_CLOEXEC);
}

/* Whether this process can have no userfaultfd at all, not even one for
 * user-mode faults (a container's seccomp profile; scripts/nouffd): then
 * FM_ENGINE_AUTO must pick the protect engine. */
static int userfaultfd_refused(void) {
    long fd = syscall(SYS_userfaultfd, O_CLOEXEC | 1 /* UFFD_USER_MODE_ONLY */);
    if (fd >= 0) {
        close((int)fd);
        return 0;
    }
    int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (dev >= 0) {
        long got = ioctl_new(dev);
        close(dev);
        if (got >= 0) {
            close((int)got);
            return 0;
        }
    }
    return 1;
}

/* FM_ENGINE_PROTECT, asked for: the bytes of a file, the kernel's write(2)
 * from a cold mapping failing with EFAULT until fm_populate, and a
 * writable mapping's writes reaching the file. */
static void protect_engine(const char *path, uint8_t *data, size_t len) {
    fm_config config = {.size = sizeof config, .engine = FM_ENGINE_PROTECT};
    fm_pager *pager = fm_pager_new(&config);
    CHECK(pager != NULL, "a protect pager");
    if (!pager)
        return;
    char why[256];
    CHECK(fm_pager_engine(pager, why, sizeof why) == FM_ENGINE_PROTECT, "the engine");
    CHECK(strstr(why, "asked for") != NULL, "why: %s", why);
    CHECK(fm_pager_engine(NULL, NULL, 0) == -EINVAL, "fm_pager_engine(NULL)");
    fm_mapping *m = fm_map(pager, path, 0, 0, 0);
    CHECK(m != NULL, "fm_map under protect");
    if (m) {
        /* A pipe: its write copies the bytes (/dev/null reads none). */
        int pipe_fds[2];
        CHECK(pipe(pipe_fds) == 0, "pipe: %s", strerror(errno));
        int out = pipe_fds[1];
        const uint8_t *p = fm_mapping_ptr(m);
        errno = 0;
        CHECK(write(out, p + 65536, 4096) == -1 && errno == EFAULT,
              "write(2) from a page not mapped yet: errno %d", errno);
        CHECK(fm_populate(m, 65536, 8192) == 0, "fm_populate");
        CHECK(write(out, p + 65536, 8192) == 8192, "write(2) once populated: %s",
              strerror(errno));
        uint8_t got[8192];
        CHECK(read(pipe_fds[0], got, sizeof got) == (ssize_t)sizeof got &&
                  memcmp(got, data + 65536, sizeof got) == 0,
              "the bytes written from the mapping");
        close(out);
        close(pipe_fds[0]);
        CHECK(fm_populate(m, len, 1) == -EINVAL, "fm_populate past the end");
        CHECK(fm_populate(NULL, 0, 0) == -EINVAL, "fm_populate(NULL)");
        CHECK(memcmp(p, data, len) == 0, "the bytes under protect differ");
        fm_unmap(m);
    }
    fm_mapping *w = fm_map(pager, path, 0, 0, FM_WRITABLE);
    CHECK(w != NULL, "fm_map writable under protect");
    if (w) {
        uint8_t *q = (uint8_t *)fm_mapping_ptr(w);
        memcpy(q + 12345, "PROTECT!", 8);
        memcpy(data + 12345, "PROTECT!", 8);
        CHECK(fm_flush(w, 0, 0) == 0, "fm_flush under protect");
        uint8_t back[8];
        int fd = open(path, O_RDONLY);
        CHECK(fd >= 0 && pread(fd, back, 8, 12345) == 8 && memcmp(back, "PROTECT!", 8) == 0,
              "the write is in the file");
        if (fd >= 0)
            close(fd);
        /* A read(2) into the writable mapping: the kernel writes it. */
        CHECK(fm_populate(w, 0, 4096) == 0, "fm_populate a writable mapping");
        fd = open(path, O_RDONLY);
        CHECK(fd >= 0 && pread(fd, q, 4096, 0) == 4096, "read(2) into it: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        CHECK(memcmp(q, data, len) == 0, "the writable mapping's bytes");
        fm_unmap(w);
    }
    fm_pager_free(pager);
}

static void read_file(const char *path, uint8_t *out, size_t len) {
    int fd = open(path, O_RDONLY);
    size_t got = 0;
    while (fd >= 0 && got < len) {
        ssize_t n = read(fd, out + got, len - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (fd >= 0)
        close(fd);
    if (got != len) {
        fprintf(stderr, "reading %s back: %zu of %zu bytes\n", path, got, len);
        exit(2);
    }
}

/* fm_prefetch_ranges under a memory budget: a batch of rows three times
   the budget reads only what fits (the store's bytes say so), and every
   row still reads right; then a large batch left in flight by fm_unmap is
   cancelled (the unmap and the pager's free return, and the pager serves
   the next mapping). */
static void prefetch_budget_and_close(const char *path, const uint8_t *data, size_t len) {
    enum { ROWS = 1024, PAGE = 4096 };
    const uint64_t budget = 1 << 20; /* 256 pages */
    fm_config config = {.size = sizeof config};
    config.memory_budget = budget;
    fm_pager *pager = fm_pager_new(&config);
    CHECK(pager != NULL, "fm_pager_new with a budget");
    if (!pager)
        return;
    fm_mapping *m = fm_map(pager, path, 0, 0, FM_READAHEAD_OFF);
    CHECK(m != NULL, "fm_map under a budget");
    if (m) {
        static uint64_t starts[ROWS], lens[ROWS];
        size_t n = 0;
        /* A 100-byte row in every whole page of the file: 768 pages. */
        for (size_t i = 0; i < ROWS && (i + 1) * PAGE <= len; i++, n++) {
            starts[n] = i * PAGE + 10;
            lens[n] = 100;
        }
        int64_t requests = fm_prefetch_ranges(m, starts, lens, n, 1);
        CHECK(requests > 0, "fm_prefetch_ranges under a budget: %lld", (long long)requests);
        fm_stats stats;
        CHECK(fm_mapping_stats(m, &stats) == 0, "fm_mapping_stats");
        CHECK(stats.io_bytes <= budget + 64 * PAGE,
              "the prefetch read %llu bytes under a budget of %llu (%zu rows)",
              (unsigned long long)stats.io_bytes, (unsigned long long)budget, n);
        const uint8_t *p = fm_mapping_ptr(m);
        for (size_t i = 0; i < n; i += 7)
            CHECK(memcmp(p + starts[i], data + starts[i], lens[i]) == 0, "row %zu differs", i);
        /* A batch left in flight: its reads are cancelled with the mapping. */
        CHECK(fm_prefetch_ranges(m, starts, lens, n, 0) >= 0, "a batch not waited for");
        fm_unmap(m);
    }
    fm_mapping *again = fm_map(pager, path, 0, 0, 0);
    CHECK(again != NULL && memcmp(fm_mapping_ptr(again), data, 65536) == 0,
          "the pager serves the next mapping after a cancelled batch");
    if (again)
        fm_unmap(again);
    fm_pager_free(pager);
}

/* The CRC-32 of zlib (and of examples/c/checksum.c) of `n` bytes. */
static uint32_t crc32_of(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

/* What the test's HTTP server answered, in memory it shares with this
 * process (MAP_SHARED). */
struct served {
    uint64_t gets;       /* GET requests */
    uint64_t body_bytes; /* bytes of the object's body sent */
};

/* The test's own HTTP server on 127.0.0.1: a child process (the leader of
 * its own process group) that serves HEAD and ranged GETs of one object,
 * with an ETag (a pinned version: the disk cache keeps only those), one
 * process per connection. */
struct http_server {
    pid_t pid;
    int port;
    struct served *served;
};

/* Writes all `len` bytes of `buf` to `fd`; 0, or -1. */
static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* The end of the first request head in `buf[0..have)` (the index past its
 * blank line), or 0 if it is not all there yet. */
static size_t head_end(const char *buf, size_t have) {
    for (size_t i = 0; i + 4 <= have; i++)
        if (memcmp(buf + i, "\r\n\r\n", 4) == 0)
            return i + 4;
    return 0;
}

/* Serves the requests of one connection until the client closes it. */
static void serve_connection(int fd, const uint8_t *data, size_t len, struct served *served) {
    static char buf[16384];
    char head[16384], reply[512];
    size_t have = 0;
    for (;;) {
        size_t end;
        while ((end = head_end(buf, have)) == 0) {
            if (have == sizeof buf)
                return;
            ssize_t n = read(fd, buf + have, sizeof buf - have);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return;
            have += (size_t)n;
        }
        /* The head in lower case (header names' case is the client's). */
        for (size_t i = 0; i < end; i++)
            head[i] = (char)((buf[i] >= 'A' && buf[i] <= 'Z') ? buf[i] + 32 : buf[i]);
        head[end] = 0;
        memmove(buf, buf + end, have - end);
        have -= end;
        const char *etag = "ETag: \"capi-v1\"\r\nAccept-Ranges: bytes\r\n";
        int n;
        if (strncmp(head, "head ", 5) == 0) {
            n = snprintf(reply, sizeof reply, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n%s\r\n",
                         len, etag);
            if (write_all(fd, reply, (size_t)n) != 0)
                return;
            continue;
        }
        if (strncmp(head, "get ", 4) != 0) {
            n = snprintf(reply, sizeof reply,
                         "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n");
            if (write_all(fd, reply, (size_t)n) != 0)
                return;
            continue;
        }
        __atomic_fetch_add(&served->gets, 1, __ATOMIC_SEQ_CST);
        unsigned long long first = 0, last = len - 1;
        const char *range = strstr(head, "\r\nrange: bytes=");
        if (range) {
            int got = sscanf(range + strlen("\r\nrange: bytes="), "%llu-%llu", &first, &last);
            if (got < 2 || last > len - 1)
                last = len - 1;
        }
        if (first >= len || first > last) {
            n = snprintf(reply, sizeof reply,
                         "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n"
                         "Content-Range: bytes */%zu\r\n\r\n",
                         len);
            if (write_all(fd, reply, (size_t)n) != 0)
                return;
            continue;
        }
        size_t body = (size_t)(last - first + 1);
        if (range)
            n = snprintf(reply, sizeof reply,
                         "HTTP/1.1 206 Partial Content\r\nContent-Length: %zu\r\n"
                         "Content-Range: bytes %llu-%llu/%zu\r\n%s\r\n",
                         body, first, last, len, etag);
        else
            n = snprintf(reply, sizeof reply, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n%s\r\n",
                         body, etag);
        if (write_all(fd, reply, (size_t)n) != 0 || write_all(fd, data + first, body) != 0)
            return;
        __atomic_fetch_add(&served->body_bytes, body, __ATOMIC_SEQ_CST);
    }
}

/* Starts the test's HTTP server over `data`; exits (the test fails) if it
 * cannot. Started before this process has threads (faultmap's), so that
 * its children fork from a single thread. */
static void start_server(struct http_server *s, const uint8_t *data, size_t len) {
    s->served = mmap(NULL, sizeof *s->served, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t addr_len = sizeof addr;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->served == MAP_FAILED || fd < 0 ||
        bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &addr_len) != 0) {
        fprintf(stderr, "FAILED: cannot start the test's HTTP server: %s\n", strerror(errno));
        exit(1);
    }
    s->port = ntohs(addr.sin_port);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "FAILED: fork for the HTTP server: %s\n", strerror(errno));
        exit(1);
    }
    if (pid == 0) {
        setpgid(0, 0);
        signal(SIGCHLD, SIG_IGN); /* connections' processes reap themselves */
        for (;;) {
            int conn = accept(fd, NULL, NULL);
            if (conn < 0) {
                if (errno == EINTR || errno == ECONNABORTED)
                    continue;
                _exit(1);
            }
            if (fork() == 0) {
                close(fd);
                serve_connection(conn, data, len, s->served);
                _exit(0);
            }
            close(conn);
        }
    }
    setpgid(pid, pid); /* as the child does: whichever runs first */
    close(fd);
    s->pid = pid;
}

/* Stops the server and every connection's process. */
static void stop_server(struct http_server *s) {
    kill(-s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    munmap(s->served, sizeof *s->served);
}

/* fm_config.disk_cache. An HTTP object read by a pager with a disk cache
 * in a fresh directory comes from the network; read by a second pager
 * (a cache opened anew on the same directory, as by a later run) it comes
 * from the disk: the server answers the open's HEAD alone (the range
 * probe is left out when the cache holds the version), and both CRCs are
 * the object's. The directory is
 * made with mode 0700. FAULTMAP_CACHE_DIR names the cache of a pager
 * whose disk_cache is NULL. A directory others may write to is refused
 * by fm_map, with a message that names it and says why; a path that is
 * not UTF-8, or empty, by fm_pager_new; and the fields past an older
 * fm_config's size (one that ended at `reserved`) are never read. */
static void disk_cache(const char *scratch, struct http_server *server, const uint8_t *data,
                       size_t len) {
    char dir[4096], url[64];
    snprintf(dir, sizeof dir, "%s/disk-cache", scratch);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/object.bin", server->port);
    const uint32_t want = crc32_of(data, len);
    for (int run = 1; run <= 2; run++) {
        uint64_t gets = __atomic_load_n(&server->served->gets, __ATOMIC_SEQ_CST);
        uint64_t sent = __atomic_load_n(&server->served->body_bytes, __ATOMIC_SEQ_CST);
        fm_config config = {.size = sizeof config, .disk_cache = dir};
        config.disk_cache_max = 64 << 20;
        fm_pager *pager = fm_pager_new(&config);
        CHECK(pager != NULL, "fm_pager_new with a disk cache");
        if (!pager)
            return;
        fm_mapping *m = fm_map(pager, url, 0, 0, 0);
        CHECK(m != NULL, "run %d: fm_map %s through a disk cache", run, url);
        if (m) {
            CHECK(fm_mapping_len(m) == len, "run %d: len %zu", run, fm_mapping_len(m));
            uint32_t got = crc32_of(fm_mapping_ptr(m), fm_mapping_len(m));
            CHECK(got == want, "run %d: crc32 %08x, the object's is %08x", run, got, want);
            fm_unmap(m);
        }
        fm_pager_free(pager);
        unsigned long long body =
            __atomic_load_n(&server->served->body_bytes, __ATOMIC_SEQ_CST) - sent;
        unsigned long long n = __atomic_load_n(&server->served->gets, __ATOMIC_SEQ_CST) - gets;
        if (run == 1)
            CHECK(body >= len, "the first run reads the network: %llu body bytes for %zu", body,
                  len);
        else
            CHECK(body == 0 && n == 0,
                  "the second run reads the disk: the server sent %llu body bytes in %llu GETs",
                  body, n);
    }
    struct stat st;
    CHECK(stat(dir, &st) == 0 && (st.st_mode & 0777) == 0700, "the cache directory's mode: %o",
          (unsigned)(st.st_mode & 0777));

    /* The environment's cache, for a pager whose disk_cache is NULL. */
    char env_dir[4096], objects[4200];
    snprintf(env_dir, sizeof env_dir, "%s/env-cache", scratch);
    snprintf(objects, sizeof objects, "%s/objects", env_dir);
    setenv("FAULTMAP_CACHE_DIR", env_dir, 1);
    fm_config plain = {.size = sizeof plain};
    fm_pager *pager = fm_pager_new(&plain);
    unsetenv("FAULTMAP_CACHE_DIR");
    CHECK(pager != NULL, "fm_pager_new under FAULTMAP_CACHE_DIR");
    if (pager) {
        fm_mapping *m = fm_map(pager, url, 0, 0, 0);
        CHECK(m != NULL && crc32_of(fm_mapping_ptr(m), len) == want,
              "fm_map through FAULTMAP_CACHE_DIR");
        CHECK(stat(objects, &st) == 0 && S_ISDIR(st.st_mode),
              "FAULTMAP_CACHE_DIR is the cache of a pager without disk_cache");
        fm_unmap(m);
        fm_pager_free(pager);
    }

    /* A directory others may write to: refused by fm_map, saying so. */
    char open_dir[4096];
    snprintf(open_dir, sizeof open_dir, "%s/open-cache", scratch);
    CHECK(mkdir(open_dir, 0700) == 0 && chmod(open_dir, 0777) == 0, "a directory of mode 0777");
    fm_config unsafe_config = {.size = sizeof unsafe_config, .disk_cache = open_dir};
    pager = fm_pager_new(&unsafe_config);
    CHECK(pager != NULL, "fm_pager_new with a directory of mode 0777 (checked at fm_map)");
    if (pager) {
        fm_mapping *m = fm_map(pager, url, 0, 0, 0);
        int refused = fm_last_errno();
        CHECK(m == NULL && refused > 0, "a cache others may write to is refused: errno %d",
              refused);
        CHECK(strstr(fm_last_error(), open_dir) != NULL &&
                  strstr(fm_last_error(), "others may write") != NULL,
              "the message names the directory and why");
        fm_unmap(m);
        /* A local file never goes through the cache: it maps. */
        char file[4200];
        snprintf(file, sizeof file, "%s/local.bin", scratch);
        free(make_file(file, 10000));
        m = fm_map(pager, file, 0, 0, 0);
        CHECK(m != NULL, "a local file with an unsafe disk cache");
        fm_unmap(m);
        unlink(file);
        fm_pager_free(pager);
    }

    /* Bad paths: EINVAL from fm_pager_new, naming the field. */
    fm_config bad = {.size = sizeof bad, .disk_cache = "/tmp/faultmap-\xff\xfe"};
    CHECK(fm_pager_new(&bad) == NULL && fm_last_errno() == EINVAL &&
              strstr(fm_last_error(), "disk_cache") != NULL,
          "a path that is not UTF-8: errno %d", fm_last_errno());
    bad.disk_cache = "";
    CHECK(fm_pager_new(&bad) == NULL && fm_last_errno() == EINVAL,
          "an empty path: errno %d", fm_last_errno());

    /* An older program's fm_config ended at `reserved` (48 bytes): what
     * follows it in memory is not its, and is not read. */
    fm_config older = {.size = 48, .disk_cache = "/tmp/faultmap-\xff", .disk_cache_max = 1};
    pager = fm_pager_new(&older);
    CHECK(pager != NULL, "an fm_config that ends at reserved: the disk cache's fields ignored");
    fm_pager_free(pager);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--joiner") == 0)
        return joiner(argv[2]);
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    char path[4096], missing[4096];
    snprintf(path, sizeof path, "%s/capi-data.bin", argv[1]);
    snprintf(missing, sizeof missing, "%s/no-such-file", argv[1]);
    const size_t len = 3 * 1024 * 1024 + 4097; /* not a whole page */
    uint8_t *data = make_file(path, len);
    /* An HTTP object of two disk-cache chunks (4 MiB each) and a bit,
     * served before faultmap starts a thread. */
    const size_t remote_len = 8 * 1024 * 1024 + 12345;
    char remote_path[4096];
    snprintf(remote_path, sizeof remote_path, "%s/capi-remote.bin", argv[1]);
    uint8_t *remote = make_file(remote_path, remote_len);
    unlink(remote_path);
    struct http_server server;
    start_server(&server, remote, remote_len);

    fm_config config = {.size = sizeof config};
    config.memory_budget = 0;
    fm_pager *pager = fm_pager_new(&config);
    CHECK(pager != NULL, "fm_pager_new");
    if (!pager)
        return 1;
    char why[256];
    int engine = fm_pager_engine(pager, why, sizeof why);
    printf("capi_test: engine %s (%s)\n", engine == FM_ENGINE_PROTECT ? "protect" : "userfaultfd",
           why);
    if (userfaultfd_refused())
        CHECK(engine == FM_ENGINE_PROTECT, "auto picks protect where userfaultfd is refused");
    else if (getenv("FAULTMAP_ENGINE") == NULL)
        CHECK(engine == FM_ENGINE_USERFAULTFD, "auto picks userfaultfd where it is allowed");

    /* Read-only: every byte, the whole file and a part of it. */
    fm_mapping *m = fm_map(pager, path, 0, 0, 0);
    CHECK(m != NULL, "fm_map %s", path);
    if (m) {
        CHECK(fm_mapping_len(m) == len, "len %zu", fm_mapping_len(m));
        CHECK(fm_mapping_page_size(m) == 4096, "page size %zu", fm_mapping_page_size(m));
        CHECK(memcmp(fm_mapping_ptr(m), data, len) == 0, "the bytes differ");
        fm_stats stats;
        CHECK(fm_mapping_stats(m, &stats) == 0, "fm_mapping_stats");
        CHECK(stats.pgfault > 0 && stats.io_bytes >= len, "pgfault %llu io_bytes %llu",
              (unsigned long long)stats.pgfault, (unsigned long long)stats.io_bytes);
        CHECK(fm_advise(m, FM_ADVICE_WILLNEED, 4096, 8192) == 0, "fm_advise");
        CHECK(fm_advise(m, 99, 0, 0) == -EINVAL, "an unknown advice");
        CHECK(fm_advise(m, FM_ADVICE_NORMAL, len, 1) == -EINVAL, "a range past the end");
        CHECK(fm_flush(m, 0, 0) == -EBADF, "fm_flush of a read-only mapping");
        fm_unmap(m);
    }
    fm_mapping *part = fm_map(pager, path, 5000, 10000, FM_READAHEAD_OFF);
    CHECK(part != NULL && fm_mapping_len(part) == 10000, "a part of the file");
    if (part) {
        CHECK(memcmp(fm_mapping_ptr(part), data + 5000, 10000) == 0, "the part's bytes differ");
        fm_unmap(part);
    }

    /* Batched prefetch: three rows (one overlapping another), waited
       for; reading them then waits for no read. */
    fm_mapping *rows = fm_map(pager, path, 0, 0, FM_READAHEAD_OFF);
    CHECK(rows != NULL, "fm_map for fm_prefetch_ranges");
    if (rows) {
        const uint64_t starts[3] = {1000000, 4100, 4200};
        const uint64_t lens[3] = {300, 200, 8000};
        int64_t requests = fm_prefetch_ranges(rows, starts, lens, 3, 1);
        CHECK(requests >= 2, "fm_prefetch_ranges: %lld requests", (long long)requests);
        CHECK(fm_prefetch_ranges(rows, starts, lens, 3, 1) == 0,
              "fm_prefetch_ranges of cached rows asks for nothing");
        const uint8_t *p = fm_mapping_ptr(rows);
        for (int i = 0; i < 3; i++)
            CHECK(memcmp(p + starts[i], data + starts[i], lens[i]) == 0, "row %d differs", i);
        fm_stats stats;
        CHECK(fm_mapping_stats(rows, &stats) == 0 && stats.pgmajfault == 0,
              "a prefetched row waited for a read (pgmajfault %llu)",
              (unsigned long long)stats.pgmajfault);
        const uint64_t past = len;
        const uint64_t one = 1;
        CHECK(fm_prefetch_ranges(rows, &past, &one, 1, 0) == -EINVAL, "a range past the end");
        CHECK(fm_prefetch_ranges(rows, NULL, lens, 3, 0) == -EINVAL, "NULL starts");
        CHECK(fm_prefetch_ranges(rows, NULL, NULL, 0, 0) == 0, "no ranges");
        CHECK(fm_prefetch_ranges(NULL, starts, lens, 3, 0) == -EINVAL, "a NULL mapping");
        fm_unmap(rows);
    }
    prefetch_budget_and_close(path, data, len);

    protect_engine(path, data, len);
    fork_children(pager, path, data, len);
    unrelated_processes(argv[0], argv[1], path, data, len);

    /* Writable: write, flush, read the file back. */
    fm_mapping *w = fm_map(pager, path, 0, 0, FM_WRITABLE);
    CHECK(w != NULL, "fm_map writable");
    if (w) {
        uint8_t *p = (uint8_t *)fm_mapping_ptr(w);
        memcpy(p + 100, "faultmap", 8);
        memcpy(data + 100, "faultmap", 8);
        p[len - 1] = 0x5A;
        data[len - 1] = 0x5A;
        CHECK(fm_flush(w, 0, 0) == 0, "fm_flush");
        uint8_t *back = malloc(len);
        read_file(path, back, len);
        CHECK(memcmp(back, data, len) == 0, "the file after fm_flush differs");
        free(back);
        fm_unmap(w);
    }

    /* Access traces: record the first touches, save them, replay them on
     * a new pager; a trace of another version is refused. */
    char trace[4096], other[4096];
    snprintf(trace, sizeof trace, "%s/capi.trace", argv[1]);
    snprintf(other, sizeof other, "%s/capi-other.bin", argv[1]);
    fm_mapping *rec = fm_map(pager, path, 0, 0, FM_RECORD_TRACE);
    CHECK(rec != NULL, "fm_map FM_RECORD_TRACE");
    if (rec) {
        const uint8_t *p = fm_mapping_ptr(rec);
        const size_t pages[] = {700, 3, 4, 250, 9};
        for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++)
            CHECK(p[pages[i] * 4096] == data[pages[i] * 4096], "page %zu", pages[i]);
        CHECK(fm_save_trace(rec, trace) == 0, "fm_save_trace");
        fm_unmap(rec);
    }
    CHECK(fm_save_trace(NULL, trace) == -EINVAL, "fm_save_trace(NULL)");
    fm_mapping *plain = fm_map(pager, path, 0, 0, 0);
    if (plain) {
        CHECK(fm_save_trace(plain, trace) == -EINVAL, "a mapping that does not record");
        CHECK(strstr(fm_last_error(), "FM_RECORD_TRACE") != NULL, "says why");
        fm_unmap(plain);
    }
    fm_pager *cold = fm_pager_new(&config);
    fm_mapping *rep = cold ? fm_map_replay(cold, path, 0, 0, FM_READAHEAD_OFF, trace) : NULL;
    CHECK(rep != NULL, "fm_map_replay");
    if (rep) {
        /* Touch the trace's pages once the replay has asked for them all
         * (a page still being read is waited for, not a miss). */
        const uint8_t *p = fm_mapping_ptr(rep);
        fm_stats stats;
        for (int i = 0; i < 20000; i++) { /* at most 20 s: a bounded wait */
            CHECK(fm_mapping_stats(rep, &stats) == 0, "fm_mapping_stats");
            if (stats.io_count >= 4)
                break;
            usleep(1000);
        }
        const size_t pages[] = {700, 3, 4, 250, 9};
        for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++)
            CHECK(p[pages[i] * 4096] == data[pages[i] * 4096], "replayed page %zu", pages[i]);
        CHECK(fm_mapping_stats(rep, &stats) == 0 && stats.pgmajfault == 0 &&
                  stats.io_count == 4,
              "replayed: pgmajfault %llu io_count %llu", (unsigned long long)stats.pgmajfault,
              (unsigned long long)stats.io_count);
        fm_unmap(rep);
    }
    free(make_file(other, len + 4096));
    CHECK(fm_map_replay(pager, other, 0, 0, 0, trace) == NULL && fm_last_errno() == EINVAL,
          "a trace of another object: errno %d", fm_last_errno());
    CHECK(strstr(fm_last_error(), "recorded on") != NULL, "says why: %s", fm_last_error());
    CHECK(fm_map_replay(pager, path, 0, 0, 0, missing) == NULL && fm_last_errno() == ENOENT,
          "a missing trace: errno %d", fm_last_errno());
    CHECK(fm_map_replay(pager, path, 0, 0, 0, path) == NULL && fm_last_errno() == EINVAL,
          "a file that is not a trace: errno %d", fm_last_errno());
    fm_mapping *none = fm_map_replay(pager, path, 0, 0, 0, NULL);
    CHECK(none != NULL, "fm_map_replay without a trace is fm_map");
    fm_unmap(none);
    fm_pager_free(cold);

    huge_pages(argv[1], path, trace);

    /* Errors: codes and messages, never a crash. */
    CHECK(fm_map(pager, missing, 0, 0, 0) == NULL && fm_last_errno() == ENOENT,
          "a missing file: errno %d", fm_last_errno());
    CHECK(strstr(fm_last_error(), "no-such-file") != NULL, "the message names the file");
    CHECK(fm_map(pager, argv[1], 0, 0, 0) == NULL && fm_last_errno() == EISDIR,
          "a directory: errno %d", fm_last_errno());
    CHECK(fm_map(pager, path, 0, 0, 0x100) == NULL && fm_last_errno() == EINVAL, "bad flags");
    CHECK(fm_map(pager, path, 0, 0, FM_READAHEAD_AROUND | FM_READAHEAD_OFF) == NULL &&
              fm_last_errno() == EINVAL,
          "two readahead modes");
    CHECK(fm_map(pager, path, len + 1, 0, 0) == NULL && fm_last_errno() == EINVAL,
          "an offset past the end: errno %d", fm_last_errno());
    CHECK(fm_map(pager, "s3://bucket/key", 0, 0, FM_WRITABLE) == NULL &&
              fm_last_errno() == EROFS,
          "a writable remote object: errno %d", fm_last_errno());
    CHECK(fm_map(pager, "gopher://example.invalid/x", 0, 0, 0) == NULL &&
              fm_last_errno() == EINVAL,
          "an unknown scheme: errno %d", fm_last_errno());
    CHECK(fm_map(NULL, path, 0, 0, 0) == NULL && fm_last_errno() == EINVAL, "a NULL pager");
    CHECK(fm_map(pager, NULL, 0, 0, 0) == NULL && fm_last_errno() == EINVAL, "a NULL path");
    CHECK(fm_mapping_ptr(NULL) == NULL && fm_mapping_len(NULL) == 0, "a NULL mapping");
    CHECK(fm_mapping_stats(NULL, NULL) == -EINVAL, "fm_mapping_stats(NULL)");
    CHECK(fm_flush(NULL, 0, 0) == -EINVAL && fm_advise(NULL, 0, 0, 0) == -EINVAL,
          "NULL mappings");
    fm_config bad = {.size = sizeof bad};
    bad.delivery = 7;
    CHECK(fm_pager_new(&bad) == NULL && fm_last_errno() == EINVAL, "an unknown delivery");
    bad.delivery = 0;
    bad.memory_budget = 1;
    CHECK(fm_pager_new(&bad) == NULL && fm_last_errno() == EINVAL,
          "a budget below the minimum: errno %d", fm_last_errno());
    /* The message pointer stays valid, and is replaced in place. */
    const char *msg = fm_last_error();
    fm_flush(NULL, 0, 0);
    CHECK(strstr(msg, "NULL") != NULL, "the message is the newest: %s", msg);
    fm_unmap(NULL);
    fm_pager_free(NULL);

    config_fields();
    disk_cache(argv[1], &server, remote, remote_len);
    stop_server(&server);
    free(remote);

    /* A mapping outlives its pager's handle. */
    fm_mapping *last = fm_map(pager, path, 0, 0, 0);
    fm_pager_free(pager);
    CHECK(last != NULL && memcmp(fm_mapping_ptr(last), data, len) == 0,
          "a mapping after fm_pager_free");
    fm_unmap(last);

    free(data);
    unlink(path);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("capi_test: every check passed\n");
    return 0;
}
