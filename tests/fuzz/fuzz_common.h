/*
 * fuzz_common.h -- what the libFuzzer targets share: a private working
 * directory (the current directory of the fuzzer process, so configs and
 * state blobs name sources by relative paths and seeds stay valid in any
 * run), a small three-source Megatron corpus, and a walk over a source that
 * touches every decoder path (lengths, mapped reads, pread reads, stats).
 */
#ifndef PL_FUZZ_COMMON_H
#define PL_FUZZ_COMMON_H

#include "fixtures.h"
#include "planner/planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* mkdtemp + chdir, once per process. */
static inline void fz_enter_tmpdir(void) {
    static int done;
    if (done) return;
    char dir[256];
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/plfuzz.XXXXXX", base ? base : "/tmp");
    if (!mkdtemp(dir) || chdir(dir) != 0) abort();
    done = 1;
}

static inline void fz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    fclose(f);
}

/* Three Megatron int32 sources src0..src2 (deterministic lengths, some
 * longer than seq_length 64) in the current directory. */
static inline void fz_write_corpus(void) {
    uint64_t x = 88172645463325252ULL;
    for (int s = 0; s < 3; s++) {
        int64_t n = 20 + 7 * s, lens[64];
        for (int64_t i = 0; i < n; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            lens[i] = 1 + (int64_t)(x % 40);
            if (x % 9 == 0) lens[i] = 64 + (int64_t)(x % 150);
        }
        char p[32];
        snprintf(p, sizeof p, "src%d", s);
        if (plf_write_megatron(p, PL_DTYPE_INT32, n, lens, 1000000 * (s + 1))) abort();
    }
}

#define FZ_CONFIG                                                             \
    "seed: 7\nseq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 2\n"    \
    "topology: {dp: 2, cp: 2}\nbalance: greedy\non_error: skip\n"             \
    "sources:\n"                                                              \
    "  - {name: a, type: megatron, path: src0, weight: 0.5}\n"                \
    "  - {name: b, type: megatron, path: src1, weight: 0.3}\n"                \
    "  - {name: c, type: megatron, path: src2, weight: 0.2}\n"

static inline pl_config *fz_config(void) {
    pl_config *cfg = NULL;
    if (pl_config_parse_string(FZ_CONFIG, strlen(FZ_CONFIG), "fuzz", &cfg)) abort();
    return cfg;
}

/*
 * A copy of a "PLST"/"PLPN" blob with its u64 length (offset 8) and its
 * trailing CRC-32 made right, so mutations reach the fields behind them.
 * NULL when too short.  The caller frees it.
 */
static inline uint8_t *fz_resealed(const uint8_t *data, size_t size) {
    if (size < 20) return NULL;
    uint8_t *b = malloc(size);
    memcpy(b, data, size);
    uint64_t n = size;
    memcpy(b + 8, &n, 8);
    uint32_t crc = pl__crc32(0, b, size - 4);
    memcpy(b + size - 4, &crc, 4);
    return b;
}

/* Touch what a source offers; errors are fine, crashes are not. */
static inline void fz_walk_source(pl_source *s) {
    int64_t n = pl_source_num_documents(s);
    int64_t buf[300];
    for (int64_t i = 0; i < n && i < 64; i++) {
        int64_t len = 0;
        if (pl_source_document_length(s, i, &len) != PL_OK) continue;
        int64_t c = len < 300 ? len : 300;
        pl_source_read(s, i, 0, c, buf, PL_DTYPE_INT64);
        pl_source_read(s, i, len - c, c, buf, PL_DTYPE_INT32);
        pl_read r = {0, 0, i, 0, c};
        pl_source_read_many(s, &r, 1, buf);
    }
    int64_t len;
    pl_source_document_length(s, -1, &len);
    pl_source_document_length(s, n, &len);
    pl_source_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    pl_source_get_stats(s, &st);
}

#endif
