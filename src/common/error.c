/*
 * error.c -- status codes, their names and descriptions (generated from
 * PL_STATUS_MAP), version numbers, and small helpers every module uses:
 * bounded formatting, the thread's last message, hashing, CRC and reading a
 * file (allocation: alloc.c).
 */
#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zlib.h>

int pl_version_number(void) { return PL_VERSION_NUMBER; }

const char *pl_version_string(void) {
#define PL__STR2(x) #x
#define PL__STR(x) PL__STR2(x)
    return PL__STR(PL_VERSION_MAJOR) "." PL__STR(PL_VERSION_MINOR) "." PL__STR(
        PL_VERSION_PATCH);
}

const char *pl_strerror(int status) {
    switch (status) {
#define PL__STATUS_DESC(name, value, desc) \
    case value:                            \
        return desc;
        PL_STATUS_MAP(PL__STATUS_DESC)
#undef PL__STATUS_DESC
    default:
        return "unknown status";
    }
}

const char *pl_err_name(int status) {
    switch (status) {
#define PL__STATUS_NAME(name, value, desc) \
    case value:                            \
        return #name;
        PL_STATUS_MAP(PL__STATUS_NAME)
#undef PL__STATUS_NAME
    default:
        return "UNKNOWN";
    }
}

size_t pl_dtype_size(int dtype) {
    switch (dtype) {
    case PL_DTYPE_UINT8:
    case PL_DTYPE_INT8:
        return 1;
    case PL_DTYPE_INT16:
    case PL_DTYPE_UINT16:
        return 2;
    case PL_DTYPE_INT32:
    case PL_DTYPE_FLOAT32:
    case PL_DTYPE_UINT32:
        return 4;
    case PL_DTYPE_INT64:
    case PL_DTYPE_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

const char *pl_dtype_name(int dtype) {
    switch (dtype) {
    case PL_DTYPE_UINT8: return "uint8";
    case PL_DTYPE_INT8: return "int8";
    case PL_DTYPE_INT16: return "int16";
    case PL_DTYPE_INT32: return "int32";
    case PL_DTYPE_INT64: return "int64";
    case PL_DTYPE_FLOAT64: return "float64";
    case PL_DTYPE_FLOAT32: return "float32";
    case PL_DTYPE_UINT16: return "uint16";
    case PL_DTYPE_UINT32: return "uint32";
    default: return "unknown";
    }
}

void pl__vfmt(char *buf, size_t cap, const char *fmt, va_list ap) {
    if (!buf || cap == 0) return;
    int n = vsnprintf(buf, cap, fmt, ap);
    if (n < 0) buf[0] = '\0';
}

/* The calling thread's last error message (pl_last_errmsg). */
static _Thread_local char tls_err[PL__ERRMSG_CAP];

void pl__thread_err(const char *msg) {
    if (msg != tls_err) pl__fmt(tls_err, sizeof tls_err, "%s", msg ? msg : "");
}

const char *pl_last_errmsg(void) { return tls_err; }

void pl__fmt(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pl__vfmt(buf, cap, fmt, ap);
    va_end(ap);
}

uint64_t pl__hash64(const void *data, size_t len, uint64_t seed) {
    return (uint64_t)XXH3_64bits_withSeed(data, len, (XXH64_hash_t)seed);
}

uint32_t pl__crc32(uint32_t crc, const void *data, size_t len) {
    /* zlib takes uInt lengths; feed large buffers in pieces. */
    const unsigned char *p = data;
    uLong c = crc;
    while (len > 0) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        c = crc32(c, p, n);
        p += n;
        len -= n;
    }
    return (uint32_t)c;
}

int pl__read_file(const char *path, void **data, size_t *len, int *err_no) {
    *data = NULL;
    *len = 0;
    *err_no = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *err_no = errno;
        return errno == ENOENT ? PL_ENOENT : PL_EIO;
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = pl__malloc(cap);
    int rc = buf ? PL_OK : PL_ENOMEM;
    while (!rc) {
        if (n == cap) {
            unsigned char *nb = pl__realloc(buf, cap * 2);
            if (!nb) {
                rc = PL_ENOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                *err_no = errno;
                rc = PL_EIO;
            }
            break;
        }
    }
    fclose(f);
    if (rc) {
        free(buf);
        return rc;
    }
    *data = buf;
    *len = n;
    return PL_OK;
}
