/* Maps a local file, an http(s):// or an s3:// object with faultmap and
 * prints its length and CRC-32 (the value of Python's zlib.crc32). With
 * -v it says on stderr which paging engine ran, and why (userfaultfd, or
 * protect where userfaultfd is refused: a default container).
 *
 *   gcc -O2 -I crates/faultmap-capi/include examples/c/checksum.c \
 *       -L target/release -lfaultmap -Wl,-rpath,$PWD/target/release -o checksum
 *   ./checksum data.bin
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "faultmap.h"

static uint32_t crc32(const uint8_t *p, size_t n) {
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

int main(int argc, char **argv) {
    int verbose = argc == 3 && strcmp(argv[1], "-v") == 0;
    if (argc != 2 && !verbose) {
        fprintf(stderr, "usage: %s [-v] PATH|URL\n", argv[0]);
        return 2;
    }
    const char *target = argv[argc - 1];
    fm_pager *pager = fm_pager_new(NULL);
    if (!pager) {
        fprintf(stderr, "faultmap: %s\n", fm_last_error());
        return 1;
    }
    if (verbose) {
        char why[256];
        int engine = fm_pager_engine(pager, why, sizeof why);
        fprintf(stderr, "engine: %s (%s)\n",
                engine == FM_ENGINE_PROTECT ? "protect" : "userfaultfd", why);
    }
    fm_mapping *m = fm_map(pager, target, 0, 0, 0);
    if (!m) {
        fprintf(stderr, "faultmap: %s (errno %d)\n", fm_last_error(), fm_last_errno());
        fm_pager_free(pager);
        return 1;
    }
    size_t len = fm_mapping_len(m);
    fm_advise(m, FM_ADVICE_SEQUENTIAL, 0, 0);
    printf("%zu bytes, crc32 %u\n", len, (unsigned)crc32(fm_mapping_ptr(m), len));
    fm_unmap(m);
    fm_pager_free(pager);
    return 0;
}
