/*
 * fixtures.h -- writers of small source files for the C tests: Megatron
 * indexed datasets, llm.c shards and flat token files, written exactly as
 * their producers write them (megatron-core's IndexedDatasetBuilder, llm.c's
 * write_datafile, numpy's tofile).  All return 0 on success, -1 on failure.
 *
 * The Megatron writer numbers tokens by position: token k of the file
 * (counted across its documents) is base + k, cast to the dtype, so a test
 * can check any read against the position it came from.
 */
#ifndef PL_FIXTURES_H
#define PL_FIXTURES_H

#include "polyload/polyload.h"
#include "polyload/polyload_experimental.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Write one value v as `dtype` (little-endian host) into f. */
static inline int plf_put_token(FILE *f, int dtype, int64_t v) {
    unsigned char b[8];
    size_t w = pl_dtype_size(dtype);
    switch (dtype) {
    case PL_DTYPE_UINT8: { uint8_t x = (uint8_t)v; memcpy(b, &x, 1); break; }
    case PL_DTYPE_INT8: { int8_t x = (int8_t)v; memcpy(b, &x, 1); break; }
    case PL_DTYPE_INT16: { int16_t x = (int16_t)v; memcpy(b, &x, 2); break; }
    case PL_DTYPE_UINT16: { uint16_t x = (uint16_t)v; memcpy(b, &x, 2); break; }
    case PL_DTYPE_INT32: { int32_t x = (int32_t)v; memcpy(b, &x, 4); break; }
    case PL_DTYPE_UINT32: { uint32_t x = (uint32_t)v; memcpy(b, &x, 4); break; }
    case PL_DTYPE_INT64: memcpy(b, &v, 8); break;
    case PL_DTYPE_FLOAT32: { float x = (float)v; memcpy(b, &x, 4); break; }
    case PL_DTYPE_FLOAT64: { double x = (double)v; memcpy(b, &x, 8); break; }
    default: return -1;
    }
    return fwrite(b, 1, w, f) == w ? 0 : -1;
}

/*
 * prefix.idx / prefix.bin with n documents (one sequence each; document
 * indices 0..n) of lengths[0..n).  Token k of the file is base + k.
 */
static inline int plf_write_megatron(const char *prefix, int dtype, int64_t n,
                                     const int64_t *lengths, int64_t base) {
    char path[4096];
    size_t w = pl_dtype_size(dtype);
    if (w == 0 || dtype == PL_DTYPE_UINT32 || n < 0) return -1;
    int rc = 0;

    snprintf(path, sizeof path, "%s.bin", prefix);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int64_t k = 0;
    for (int64_t i = 0; i < n && rc == 0; i++)
        for (int64_t j = 0; j < lengths[i] && rc == 0; j++)
            rc = plf_put_token(f, dtype, base + k++);
    if (fclose(f) != 0) rc = -1;
    if (rc) return rc;

    snprintf(path, sizeof path, "%s.idx", prefix);
    f = fopen(path, "wb");
    if (!f) return -1;
    uint64_t version = 1, seq = (uint64_t)n, docs = (uint64_t)n + 1;
    uint8_t code = (uint8_t)dtype;
    fwrite("MMIDIDX\0\0", 1, 9, f);
    fwrite(&version, 8, 1, f);
    fwrite(&code, 1, 1, f);
    fwrite(&seq, 8, 1, f);
    fwrite(&docs, 8, 1, f);
    for (int64_t i = 0; i < n; i++) {
        int32_t len = (int32_t)lengths[i];
        fwrite(&len, 4, 1, f);
    }
    int64_t ptr = 0;
    for (int64_t i = 0; i < n; i++) {
        fwrite(&ptr, 8, 1, f);
        ptr += lengths[i] * (int64_t)w;
    }
    for (int64_t i = 0; i <= n; i++) fwrite(&i, 8, 1, f);
    if (ferror(f)) rc = -1;
    if (fclose(f) != 0) rc = -1;
    return rc;
}

/* An llm.c shard: 256 x int32 header (magic 20240520 for uint16 tokens,
 * 20240801 for uint32; version 1; token count), then the tokens. */
static inline int plf_write_llmc(const char *path, int uint32_tokens,
                                 const int64_t *tokens, int64_t n) {
    int32_t header[256];
    memset(header, 0, sizeof header);
    header[0] = uint32_tokens ? 20240801 : 20240520;
    header[1] = 1;
    header[2] = (int32_t)n;
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int rc = fwrite(header, sizeof header, 1, f) == 1 ? 0 : -1;
    int dtype = uint32_tokens ? PL_DTYPE_UINT32 : PL_DTYPE_UINT16;
    for (int64_t i = 0; i < n && rc == 0; i++)
        rc = plf_put_token(f, dtype, tokens[i]);
    if (fclose(f) != 0) rc = -1;
    return rc;
}

/* A flat token file: n tokens of `dtype` (PL_DTYPE_UINT16 or UINT32; any
 * dtype is written as asked), no header. */
static inline int plf_write_flat(const char *path, int dtype,
                                 const int64_t *tokens, int64_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++)
        rc = plf_put_token(f, dtype, tokens[i]);
    if (fclose(f) != 0) rc = -1;
    return rc;
}

/* Overwrite len bytes at byte offset `offset` of an existing file. */
static inline int plf_patch(const char *path, long offset, const void *data,
                            size_t len) {
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int rc = fseek(f, offset, SEEK_SET) == 0 &&
                     fwrite(data, 1, len, f) == len
                 ? 0
                 : -1;
    if (fclose(f) != 0) rc = -1;
    return rc;
}

/* A ustar member `name` holding data[0, n), padded to 512 bytes (tar(5)). */
static inline void plf_tar_add(FILE *f, const char *name, const void *data, size_t n) {
    uint8_t h[512] = {0};
    snprintf((char *)h, 100, "%s", name);
    snprintf((char *)h + 100, 8, "%07o", 0644);
    snprintf((char *)h + 108, 8, "%07o", 0);
    snprintf((char *)h + 116, 8, "%07o", 0);
    snprintf((char *)h + 124, 12, "%011zo", n);
    snprintf((char *)h + 136, 12, "%011o", 0);
    h[156] = '0';
    memcpy(h + 257, "ustar\0" "00", 8);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    fwrite(h, 1, 512, f);
    fwrite(data, 1, n, f);
    static const uint8_t zero[512];
    fwrite(zero, 1, (512 - n % 512) % 512, f);
}

/* The two zero blocks that end a tar archive; closes f. */
static inline void plf_tar_end(FILE *f) {
    static const uint8_t zero[1024];
    fwrite(zero, 1, 1024, f);
    fclose(f);
}

#endif
