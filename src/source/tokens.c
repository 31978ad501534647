/*
 * source/tokens.c -- llm.c shards and flat token files, and their .plidx
 * sidecar document index.
 *
 * Neither format stores document boundaries: they are the positions of
 * eos_id.  llm.c puts <|endoftext|> *before* each document, so a document
 * starts at each eos (tokens before the first eos form a document of their
 * own); a flat file ends each document with eos (trailing tokens after the
 * last eos form a final document).  Finding them needs one scan of the whole
 * file, so the result is kept in "<file>.plidx": a 64-byte header (magic
 * "PLIDX\0\0\0", u32 version, u32 token width, u32 source type, u32 0, i64
 * eos_id, u64 data file size, i64 data file mtime in ns, u64 document count,
 * u32 0, u32 CRC-32 of bytes 0..59) followed by u64 end offsets (exclusive,
 * in tokens) of every document.  The scan writes the offsets into an
 * anonymous mapping that grows with mremap; the sidecar is then written to a
 * temporary file and renamed into place, so readers never see half of one,
 * and mapped.  A sidecar whose header does not match the data file (size,
 * mtime, eos_id, width, type), or that fails its CRC or size check, is
 * rebuilt.
 *
 * Writing policy (pl_source_options.write_index, PL_INDEX_*): with
 * PL_INDEX_WRITE (the default) one process at a time builds and writes a
 * missing sidecar: it holds flock(LOCK_EX) on the data file while it scans,
 * writes and renames; the others wait on the lock, then find the new sidecar
 * and map it, so N processes opening a new file scan it once and write it
 * once.  PL_INDEX_READ maps a matching sidecar but never writes one (what
 * `polyload inspect` does): without one the index is built in memory.
 * PL_INDEX_MEMORY neither reads nor writes a sidecar.  When the directory is
 * not writable the anonymous mapping is kept.
 *
 * The end offsets are trusted only as far as O(1) checks go at open (the last
 * one must equal the token count); each document's offsets are checked when
 * the document is touched (PL_EBOUNDS).
 */
#include "source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* An llm.c shard or flat file: the common record, then its tokens and the
 * document end offsets (in idx_map: a .plidx sidecar or anonymous memory). */
typedef struct pl__kfile {
    pl__sfile base;
    const uint8_t *tokens; /* token 0 (llm.c: byte 1024 of the shard) */
    int64_t n_tokens;
    const uint64_t *ends; /* [n_docs] exclusive end offsets, in tokens */
} pl__kfile;

/* ------------------------------------------------------------ the scan */

/* A growable array of u64 in anonymous memory (never the malloc heap). */
typedef struct pl__ends {
    uint64_t *a;
    size_t n;
    size_t cap; /* elements */
} pl__ends;

static int ends_grow(pl__ends *e) {
    size_t ncap = e->cap ? e->cap * 2 : (size_t)1 << 13;
    void *p;
    if (e->a)
        p = mremap(e->a, e->cap * 8, ncap * 8, MREMAP_MAYMOVE);
    else
        p = mmap(NULL, ncap * 8, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return PL_ENOMEM;
    e->a = p;
    e->cap = ncap;
    return PL_OK;
}

static int ends_push(pl__ends *e, uint64_t v) {
    if (e->n == e->cap) {
        int rc = ends_grow(e);
        if (rc) return rc;
    }
    e->a[e->n++] = v;
    return PL_OK;
}

/* Scan n tokens of type T for eos.  llmc: boundaries before each eos (except
 * at 0); flat: after each eos.  The last document always ends at n. */
#define PL__SCAN(NAME, T)                                                    \
    static int NAME(const uint8_t *tok, int64_t n, uint64_t eos, int llmc,   \
                    pl__ends *e) {                                           \
        int rc;                                                              \
        if (eos > (uint64_t)(T)~(T)0) goto tail; /* never matches */         \
        T t = (T)eos;                                                        \
        for (int64_t p = 0; p < n; p++) {                                    \
            T v;                                                             \
            memcpy(&v, tok + (size_t)p * sizeof(T), sizeof(T));              \
            if (v != t) continue;                                            \
            if (llmc) {                                                      \
                if (p > 0 && (rc = ends_push(e, (uint64_t)p))) return rc; \
            } else {                                                         \
                if ((rc = ends_push(e, (uint64_t)p + 1))) return rc;     \
            }                                                                \
        }                                                                    \
    tail:                                                                    \
        if (n > 0 && (e->n == 0 || e->a[e->n - 1] != (uint64_t)n))           \
            return ends_push(e, (uint64_t)n);                            \
        return PL_OK;                                                        \
    }
PL__SCAN(pl__scan_u16, uint16_t)
PL__SCAN(pl__scan_u32, uint32_t)
#undef PL__SCAN

/* ------------------------------------------------------------ sidecar */

typedef struct pl__want {
    uint32_t width;
    uint32_t type;
    int64_t eos;
    uint64_t size;
    int64_t mtime_ns;
    int64_t n_tokens;
} pl__want;

static void plidx_header(uint8_t h[PL__PLIDX_HEADER], const pl__want *w,
                             uint64_t count) {
    memset(h, 0, PL__PLIDX_HEADER);
    memcpy(h, PL__PLIDX_MAGIC, 8);
    pl__st_u32(h + 8, PL__PLIDX_VERSION);
    pl__st_u32(h + 12, w->width);
    pl__st_u32(h + 16, w->type);
    pl__st_u64(h + 24, (uint64_t)w->eos);
    pl__st_u64(h + 32, w->size);
    pl__st_u64(h + 40, (uint64_t)w->mtime_ns);
    pl__st_u64(h + 48, count);
    pl__st_u32(h + 60, pl__crc32(0, h, 60));
}

/* Does a mapped sidecar fit the data file?  Returns the document count, or
 * -1 when it must be rebuilt. */
static int64_t plidx_check(const uint8_t *m, size_t len,
                               const pl__want *w) {
    if (len < PL__PLIDX_HEADER) return -1;
    if (memcmp(m, PL__PLIDX_MAGIC, 8) != 0) return -1;
    if (pl__ld_u32(m + 60) != pl__crc32(0, m, 60)) return -1;
    if (pl__ld_u32(m + 8) != PL__PLIDX_VERSION) return -1;
    if (pl__ld_u32(m + 12) != w->width || pl__ld_u32(m + 16) != w->type)
        return -1;
    if ((int64_t)pl__ld_u64(m + 24) != w->eos) return -1;
    if (pl__ld_u64(m + 32) != w->size) return -1;
    if ((int64_t)pl__ld_u64(m + 40) != w->mtime_ns) return -1;
    uint64_t count = pl__ld_u64(m + 48);
    if (count > (len - PL__PLIDX_HEADER) / 8 ||
        len != PL__PLIDX_HEADER + count * 8)
        return -1;
    if (count == 0) return w->n_tokens == 0 ? 0 : -1;
    if (pl__ld_u64(m + PL__PLIDX_HEADER + (count - 1) * 8) !=
        (uint64_t)w->n_tokens)
        return -1;
    /* The header's CRC does not cover the offsets: one pass checks that
     * they increase strictly (8 bytes per document), else rebuild. */
    uint64_t prev = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t v = pl__ld_u64(m + PL__PLIDX_HEADER + i * 8);
        if (v <= prev) return -1;
        prev = v;
    }
    return (int64_t)count;
}

/* Map an existing sidecar if it fits.  1 when f now uses it, 0 otherwise. */
static int plidx_load(pl__kfile *kf, const char *ipath, const pl__want *w) {
    pl__sfile *f = &kf->base;
    int fd = open(ipath, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= PL__PLIDX_HEADER)
        m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return 0;
    }
    int64_t count = plidx_check(m, (size_t)st.st_size, w);
    if (count < 0) {
        close(fd);
        munmap(m, (size_t)st.st_size);
        return 0;
    }
    pl__fwatch_keep(&f->idx_w, fd, &st); /* watched for shrinking */
    f->idx_map = m;
    f->idx_len = (size_t)st.st_size;
    kf->ends = (const uint64_t *)((const uint8_t *)m + PL__PLIDX_HEADER);
    f->n_docs = count;
    f->index_in_memory = 0;
    return 1;
}

static int write_all(int fd, const void *buf, size_t len) {
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t k = write(fd, p, len);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

/* Write the sidecar atomically (temporary file + rename).  0 on success. */
static int plidx_write(const char *ipath, const pl__want *w,
                           const pl__ends *e) {
    char tmp[4200];
    pl__fmt(tmp, sizeof tmp, "%s.tmp.XXXXXX", ipath);
    int fd = mkstemp(tmp);
    if (fd < 0) return -1;
    uint8_t h[PL__PLIDX_HEADER];
    plidx_header(h, w, e->n);
    int bad = fchmod(fd, 0644) != 0 || write_all(fd, h, sizeof h) != 0 ||
              (e->n && write_all(fd, e->a, e->n * 8) != 0);
    bad |= close(fd) != 0;
    if (!bad) bad = rename(tmp, ipath) != 0;
    if (bad) unlink(tmp);
    return bad ? -1 : 0;
}

/* ------------------------------------------------------------ open */

/*
 * A flat file has no magic, so a text file (a config, a JSONL, a README
 * passed by mistake) would be read as tokens.  Text has no NUL byte and is
 * UTF-8; a token file of 16- or 32-bit ids has a zero high byte in every id
 * below 256 (or 65536) and, with eos_id 0, NULs at every document end, so
 * its first 4 KiB almost never pass.  At least 16 bytes are needed to judge.
 */
static int looks_like_text(const uint8_t *m, int64_t size) {
    int64_t n = size < 4096 ? size : 4096;
    if (n < 16) return 0;
    for (int64_t i = 0; i < n;) {
        uint8_t c = m[i];
        if (c < 0x80) {
            if (c < 0x20 && c != '\n' && c != '\r' && c != '\t' && c != '\f')
                return 0;
            if (c == 0x7f) return 0;
            i++;
            continue;
        }
        int extra = (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2
                  : (c & 0xf8) == 0xf0 ? 3 : -1;
        if (extra < 0 || c == 0xc0 || c == 0xc1) return 0;
        if (i + extra >= n) break; /* a character cut by the 4 KiB window */
        for (int k = 1; k <= extra; k++)
            if ((m[i + k] & 0xc0) != 0x80) return 0;
        i += 1 + extra;
    }
    return 1;
}

/* Open an llm.c shard (llmc 1) or a flat file (0) and find its documents. */
static int tokens_open(pl_source *src, pl__sfile *f, int llmc, char *err,
                           size_t errcap) {
    pl__kfile *kf = (pl__kfile *)f;
    const pl_dtype flat_dtype = src->dtype; /* the configured dtype (flat) */
    const int64_t eos_id = src->eos_id;
    int write_index = src->write_index;
    struct stat st;
    int fd = -1;
    int rc = pl__map_any(f, f->path, 0, &f->data_map, &f->data_len, &st, &fd, err,
                         errcap);
    if (rc) return rc;
    if (f->rdata) {
        /* A remote shard: its boundaries are found by reading it once (then
           it stays in the cache), and held in memory (no sidecar is written
           into a bucket). */
        rc = pl__source_ensure(f, 0, (int64_t)f->data_len, err, errcap);
        if (rc) return rc;
        write_index = PL_INDEX_MEMORY;
    }
    pl__fwatch_keep(&f->data_w, fd, &st);
    const uint8_t *m = f->data_map;
    int64_t size = (int64_t)f->data_len;

    if (llmc) {
        if (size < PL__LLMC_HEADER) {
            pl__fmt(err, errcap,
                    "%s: truncated at offset %lld: the llm.c header needs %d "
                    "bytes",
                    f->path, (long long)size, PL__LLMC_HEADER);
            return PL_ETRUNC;
        }
        int32_t magic, version, count;
        memcpy(&magic, m, 4);
        memcpy(&version, m + 4, 4);
        memcpy(&count, m + 8, 4);
        if (magic == PL__LLMC_MAGIC_U16) {
            f->dtype = PL_DTYPE_UINT16;
        } else if (magic == PL__LLMC_MAGIC_U32) {
            f->dtype = PL_DTYPE_UINT32;
        } else {
            pl__fmt(err, errcap,
                    "%s: bad magic %d at offset 0, expected %d or %d", f->path,
                    (int)magic, PL__LLMC_MAGIC_U16, PL__LLMC_MAGIC_U32);
            return PL_EMAGIC;
        }
        if (version != 1) {
            pl__fmt(err, errcap,
                    "%s: unknown version %d at offset 4, expected 1", f->path,
                    (int)version);
            return PL_EVERSION;
        }
        f->width = pl_dtype_size(f->dtype);
        int64_t need = PL__LLMC_HEADER + (int64_t)count * (int64_t)f->width;
        if (count < 0 || need > size) {
            if (count < 0) {
                pl__fmt(err, errcap,
                        "%s: negative token count %d at offset 8", f->path,
                        (int)count);
                return PL_ECOUNT;
            }
            pl__fmt(err, errcap,
                    "%s: truncated at offset %lld: token count %d (offset 8) "
                    "needs %lld bytes",
                    f->path, (long long)size, (int)count, (long long)need);
            return PL_ETRUNC;
        }
        if (need < size) {
            pl__fmt(err, errcap,
                    "%s: token count %d at offset 8 does not add up to the "
                    "file size %lld (expected %lld)",
                    f->path, (int)count, (long long)size, (long long)need);
            return PL_ECOUNT;
        }
        kf->tokens = m + PL__LLMC_HEADER;
        kf->n_tokens = count;
    } else {
        f->dtype = flat_dtype;
        f->width = pl_dtype_size(flat_dtype);
        if (looks_like_text(m, size)) {
            char head[33];
            int64_t k = 0;
            for (; k < size && k < 32; k++)
                head[k] = m[k] == '\n' || m[k] == '\r' || m[k] == '\t'
                              ? ' '
                              : (m[k] < 0x80 ? (char)m[k] : '?');
            head[k] = '\0';
            pl__fmt(err, errcap,
                    "%s: the file holds text (or YAML), not %s tokens: it "
                    "starts with \"%s\"; a flat source is a raw token array "
                    "(tokenize text with `polyload prepare`)",
                    f->path, pl_dtype_name(flat_dtype), head);
            return PL_EMAGIC;
        }
        if (size % (int64_t)f->width != 0) {
            pl__fmt(err, errcap,
                    "%s: truncated at offset %lld: the size is not a multiple "
                    "of the %s token size",
                    f->path, (long long)size, pl_dtype_name(flat_dtype));
            return PL_ETRUNC;
        }
        kf->tokens = m;
        kf->n_tokens = size / (int64_t)f->width;
    }
    pl__want w = {
        .width = (uint32_t)f->width,
        .type = (uint32_t)src->ops->type,
        .eos = eos_id,
        .size = (uint64_t)st.st_size,
        .mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 +
                    (int64_t)st.st_mtim.tv_nsec,
        .n_tokens = kf->n_tokens,
    };
    char ipath[4096];
    pl__fmt(ipath, sizeof ipath, "%s.plidx", f->path);
    if (write_index != PL_INDEX_MEMORY && plidx_load(kf, ipath, &w)) return PL_OK;
    /* One writer at a time: lock the data file, then look again (another
       process may have written the sidecar while this one waited). */
    int lockfd = -1;
    if (write_index == PL_INDEX_WRITE) {
        lockfd = open(f->path, O_RDONLY | O_CLOEXEC);
        if (lockfd >= 0) {
            int lrc;
            while ((lrc = flock(lockfd, LOCK_EX)) != 0 && errno == EINTR) {
            }
            if (lrc != 0) { /* no locks here (some network file systems) */
                close(lockfd);
                lockfd = -1;
            } else if (plidx_load(kf, ipath, &w)) {
                close(lockfd); /* releases the lock */
                return PL_OK;
            }
        }
    }

    /* Build: one scan of the tokens. */
    pl__ends e = {0};
    if (f->width == 2)
        rc = pl__scan_u16(kf->tokens, kf->n_tokens, (uint64_t)eos_id,
                          llmc, &e);
    else
        rc = pl__scan_u32(kf->tokens, kf->n_tokens, (uint64_t)eos_id,
                          llmc, &e);
    if (rc) {
        if (lockfd >= 0) close(lockfd);
        if (e.a) munmap(e.a, e.cap * 8);
        pl__fmt(err, errcap, "%s: out of memory building the document index",
                f->path);
        return rc;
    }
    int written = write_index == PL_INDEX_WRITE && plidx_write(ipath, &w, &e) == 0 &&
                  plidx_load(kf, ipath, &w);
    if (lockfd >= 0) close(lockfd);
    if (written) {
        if (e.a) munmap(e.a, e.cap * 8);
        return PL_OK;
    }
    /* Read-only directory, or in memory by policy. */
    f->idx_map = e.a;
    f->idx_len = e.cap * 8;
    f->idx_anon = 1;
    kf->ends = e.a;
    f->n_docs = (int64_t)e.n;
    f->index_in_memory = 1;
    if (e.a) mprotect(e.a, e.cap * 8, PROT_READ);
    return PL_OK;
}

static int tokens_doc(const pl_source *src, const pl__sfile *bf, int64_t r,
                          const uint8_t **tokens, int64_t *length, char *err,
                          size_t errcap) {
    (void)src;
    const pl__kfile *f = (const pl__kfile *)bf;
    uint64_t start = r > 0 ? f->ends[r - 1] : 0;
    uint64_t end = f->ends[r];
    if (end <= start || end > (uint64_t)f->n_tokens) {
        pl__fmt(err, errcap,
                "%s%s: record %lld: document end offset %llu (offset %lld) "
                "is not after its start %llu or is past the end of %s "
                "(%lld tokens)",
                f->base.path, f->base.index_in_memory ? " (in-memory index)" : ".plidx",
                (long long)r, (unsigned long long)end,
                (long long)(PL__PLIDX_HEADER + 8 * r),
                (unsigned long long)start, f->base.path, (long long)f->n_tokens);
        return PL_EBOUNDS;
    }
    *tokens = f->tokens + start * f->base.width;
    *length = (int64_t)(end - start);
    return PL_OK;
}

static int llmc_open(pl_source *src, pl__sfile *f, int skip_damaged, char *err,
                         size_t errcap) {
    (void)skip_damaged;
    return tokens_open(src, f, 1, err, errcap);
}

static int flat_open(pl_source *src, pl__sfile *f, int skip_damaged, char *err,
                         size_t errcap) {
    (void)skip_damaged;
    return tokens_open(src, f, 0, err, errcap);
}

static void tokens_prefetch(const pl__sfile *bf, int64_t r) {
    const pl__kfile *f = (const pl__kfile *)bf;
    if (f->ends) __builtin_prefetch(f->ends + (r > 0 ? r - 1 : 0));
}

static int llmc_init(pl_source *src, const pl_source_options *opts,
                         int skip_damaged, char *err, size_t errcap) {
    (void)skip_damaged;
    int rc = pl__source_init_common(src, opts, 50256, 1, err, errcap);
    src->dtype = opts->token_dtype ? opts->token_dtype : PL_DTYPE_UINT16;
    return rc;
}

static int flat_init(pl_source *src, const pl_source_options *opts,
                         int skip_damaged, char *err, size_t errcap) {
    (void)skip_damaged;
    int rc = pl__source_init_common(src, opts, 0, 1, err, errcap);
    if (rc) return rc;
    pl_dtype flat = opts->token_dtype ? opts->token_dtype : PL_DTYPE_UINT16;
    if (flat != PL_DTYPE_UINT16 && flat != PL_DTYPE_UINT32) {
        pl__fmt(err, errcap,
                "source %s: token_dtype %s is not supported for flat files "
                "(uint16 or uint32)",
                src->name, pl_dtype_name(flat));
        return PL_EINVAL;
    }
    src->dtype = flat;
    return PL_OK;
}

const pl__source_ops pl__llmc_ops = {
    .version = PL__SOURCE_OPS_VERSION,
    .type = PL_SOURCE_LLMC,
    .name = "llmc",
    .flags = PL__SRC_GUARD_INDEX,
    .file_size = sizeof(pl__kfile),
    .data_suffix = "",
    .index_suffix = ".plidx",
    .unit = "record",
    .init = llmc_init,
    .open_file = llmc_open,
    .doc = tokens_doc,
    .prefetch = tokens_prefetch,
};

const pl__source_ops pl__flat_ops = {
    .version = PL__SOURCE_OPS_VERSION,
    .type = PL_SOURCE_FLAT,
    .name = "flat",
    .flags = PL__SRC_GUARD_INDEX,
    .file_size = sizeof(pl__kfile),
    .data_suffix = "",
    .index_suffix = ".plidx",
    .unit = "record",
    .init = flat_init,
    .open_file = flat_open,
    .doc = tokens_doc,
    .prefetch = tokens_prefetch,
};
