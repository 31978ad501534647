/*
 * source/megatron.c -- megatron-core MMapIndexedDataset (version 1) files.
 *
 * The .idx is what megatron/core/datasets/indexed_dataset.py's _IndexWriter
 * writes: b"MMIDIDX\x00\x00", u64 version (1), u8 dtype code, u64
 * sequence_count, u64 document_count, then int32 sequence_lengths[S], int64
 * sequence_pointers[S] (byte offsets into the .bin), int64
 * document_indices[D] (0 .. S), optionally int8 sequence_modes[S]
 * (multimodal).  All little-endian and packed: the arrays start at byte 34,
 * so nothing is aligned and every load goes through memcpy.
 *
 * Opening maps both files and checks the header fields, that the counts add
 * up to the .idx size, that document_indices runs non-decreasing from 0 to
 * sequence_count (one sequential pass over 8 bytes per document: the only
 * per-document work at open), and that the .bin is as long as the last
 * sequence claims.  Each sequence's own pointer and length are checked when
 * that document is touched, so a single bad record fails (or is skipped)
 * alone.  A document is one sequence, as GPTDataset treats it.
 */
#include "source/source.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const unsigned char pl__mm_magic[9] = {'M', 'M', 'I', 'D', 'I',
                                              'D', 'X', 0,   0};

/* Byte offsets of the arrays inside the .idx. */
static int64_t pl__off_length(const pl__sfile *f, int64_t r) {
    (void)f;
    return PL__MEGATRON_HEADER + 4 * r;
}
static int64_t pl__off_pointer(const pl__sfile *f, int64_t r) {
    return PL__MEGATRON_HEADER + 4 * f->seq_count + 8 * r;
}
static int64_t pl__off_docidx(const pl__sfile *f, int64_t i) {
    return PL__MEGATRON_HEADER + 12 * f->seq_count + 8 * i;
}

/* Does record r end past the .bin (or point at nonsense)? */
static int pl__past_end(const pl__sfile *f, int64_t r) {
    int64_t ptr = pl__ld_i64(f->pointers + 8 * r);
    int64_t len = pl__ld_i32(f->lengths + 4 * r);
    if (ptr < 0 || len < 0 || ptr > f->token_bytes) return 1;
    return len > (f->token_bytes - ptr) / (int64_t)f->width;
}

int pl__megatron_open(pl__sfile *f, int skip_trailing, char *err,
                      size_t errcap) {
    char path[4096];
    struct stat st;
    int rc;

    pl__fmt(path, sizeof path, "%s.idx", f->path);
    int ifd = -1;
    rc = pl__map_any(f, path, 1, &f->idx_map, &f->idx_len, &st, &ifd, err, errcap);
    if (rc) return rc;
    pl__fwatch_keep(&f->idx_w, ifd, &st);
    const uint8_t *m = f->idx_map;
    int64_t size = (int64_t)f->idx_len;

    if (size < PL__MEGATRON_HEADER) {
        pl__fmt(err, errcap,
                "%s: truncated at offset %lld: the header needs %d bytes",
                path, (long long)size, PL__MEGATRON_HEADER);
        return PL_ETRUNC;
    }
    if (memcmp(m, pl__mm_magic, sizeof pl__mm_magic) != 0) {
        pl__fmt(err, errcap, "%s: bad magic at offset 0, expected MMIDIDX",
                path);
        return PL_EMAGIC;
    }
    uint64_t version = pl__ld_u64(m + 9);
    if (version != 1) {
        pl__fmt(err, errcap,
                "%s: unknown version %llu at offset 9, expected 1", path,
                (unsigned long long)version);
        return PL_EVERSION;
    }
    unsigned code = m[17];
    if (code < PL_DTYPE_UINT8 || code > PL_DTYPE_UINT16) {
        pl__fmt(err, errcap,
                "%s: unknown dtype code %u at offset 17, expected 1..8", path,
                code);
        return PL_EDTYPE;
    }
    f->dtype = (pl_dtype)code;
    f->width = pl_dtype_size((int)code);

    uint64_t s = pl__ld_u64(m + 18);
    uint64_t d = pl__ld_u64(m + 26);
    /* Bound each count by the file size first so the sum cannot overflow. */
    uint64_t room = (uint64_t)(size - PL__MEGATRON_HEADER);
    uint64_t need = 0;
    int fits = s <= room / 12 && d <= room / 8;
    if (fits) {
        need = 12 * s + 8 * d;
        fits = need == room || need + s == room; /* + int8 modes */
    }
    if (!fits) {
        pl__fmt(err, errcap,
                "%s: sequence_count %llu (offset 18) and document_count %llu "
                "(offset 26) do not add up to the file size %lld",
                path, (unsigned long long)s, (unsigned long long)d,
                (long long)size);
        return PL_ECOUNT;
    }
    f->seq_count = (int64_t)s;
    f->docidx_count = (int64_t)d;
    f->lengths = m + PL__MEGATRON_HEADER;
    f->pointers = m + pl__off_pointer(f, 0);
    f->docidx = m + pl__off_docidx(f, 0);
    f->n_docs = f->seq_count;

    if (d == 0) {
        pl__fmt(err, errcap,
                "%s: document_indices is empty (document_count 0 at offset "
                "26); it must start at 0",
                path);
        return PL_EDOCIDX;
    }
    int64_t first = pl__ld_i64(f->docidx);
    if (first != 0) {
        pl__fmt(err, errcap,
                "%s: document_indices[0] is %lld at offset %lld, expected 0",
                path, (long long)first, (long long)pl__off_docidx(f, 0));
        return PL_EDOCIDX;
    }
    int64_t last = pl__ld_i64(f->docidx + 8 * (d - 1));
    if (last != f->seq_count) {
        pl__fmt(err, errcap,
                "%s: document_indices[%llu] is %lld at offset %lld, expected "
                "sequence_count %lld",
                path, (unsigned long long)(d - 1), (long long)last,
                (long long)pl__off_docidx(f, (int64_t)d - 1),
                (long long)f->seq_count);
        return PL_EDOCIDX;
    }
    rc = pl__megatron_check_docidx(f, err, errcap);
    if (rc) return rc;
    /* Reads need only the lengths and pointers: unmap the whole pages after
     * them (document_indices, checked above, and the multimodal modes), so
     * that the kernel's fault-around, which maps the cached pages near a
     * fault within the mapping, does not make them resident in every
     * process that reads (8 of every 20 bytes per record). */
    {
        long pg = sysconf(_SC_PAGESIZE);
        size_t keep = (size_t)pl__off_docidx(f, 0);
        if (pg > 0) keep = (keep + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
        if (pg > 0 && keep < f->idx_len &&
            munmap((uint8_t *)f->idx_map + keep, f->idx_len - keep) == 0)
            f->idx_map_len = keep;
        f->docidx = NULL;
    }

    pl__fmt(path, sizeof path, "%s.bin", f->path);
    int fd = -1;
    rc = pl__map_any(f, path, 0, &f->data_map, &f->data_len, &st, &fd, err, errcap);
    if (rc) return rc;
    pl__fwatch_keep(&f->data_w, fd, &st);
    f->tokens = f->data_map;
    f->token_bytes = (int64_t)f->data_len;

    /* The .bin must reach the end of the last sequence.  A pointer or length
     * that is nonsense on its own is left to the per-document check. */
    if (f->seq_count > 0) {
        int64_t r = f->seq_count - 1;
        int64_t ptr = pl__ld_i64(f->pointers + 8 * r);
        int64_t len = pl__ld_i32(f->lengths + 4 * r);
        if (ptr >= 0 && len >= 0 && ptr <= INT64_MAX / 2) {
            int64_t end = ptr + len * (int64_t)f->width;
            if (end > f->token_bytes && skip_trailing) {
                /* A truncated .bin: leave out the records at the end that
                   point past it, the same on every rank. */
                while (r >= 0 && pl__past_end(f, r)) r--;
                f->n_docs = r + 1;
                f->skipped = f->seq_count - f->n_docs;
            } else if (end > f->token_bytes) {
                pl__fmt(err, errcap,
                        "%s: truncated at offset %lld: the last sequence "
                        "(record %lld, pointer at %s.idx offset %lld) ends at "
                        "byte %lld",
                        path, (long long)f->token_bytes, (long long)r,
                        f->path, (long long)pl__off_pointer(f, r),
                        (long long)end);
                return PL_ETRUNC;
            }
        }
    }
    return PL_OK;
}

int pl__megatron_doc(const pl__sfile *f, int64_t r, const uint8_t **tokens,
                     int64_t *length, char *err, size_t errcap) {
    int64_t len = pl__ld_i32(f->lengths + 4 * r);
    int64_t ptr = pl__ld_i64(f->pointers + 8 * r);
    if (len < 0) {
        pl__fmt(err, errcap,
                "%s.idx: record %lld: negative sequence length %lld at "
                "offset %lld",
                f->path, (long long)r, (long long)len,
                (long long)pl__off_length(f, r));
        return PL_EBOUNDS;
    }
    if (ptr < 0 || ptr > f->token_bytes ||
        len > (f->token_bytes - ptr) / (int64_t)f->width) {
        pl__fmt(err, errcap,
                "%s.idx: record %lld: sequence pointer %lld (offset %lld) "
                "with length %lld (offset %lld) is past the end of %s.bin "
                "(%lld bytes)",
                f->path, (long long)r, (long long)ptr,
                (long long)pl__off_pointer(f, r), (long long)len,
                (long long)pl__off_length(f, r), f->path,
                (long long)f->token_bytes);
        return PL_EBOUNDS;
    }
    /* An empty .bin is not mapped: its documents are empty and point at a
     * static byte (NULL + 0 is undefined behaviour). */
    static const uint8_t empty[8];
    *tokens = f->tokens ? f->tokens + ptr : empty;
    *length = len;
    return PL_OK;
}

int pl__megatron_check_docidx(const pl__sfile *f, char *err, size_t errcap) {
    int64_t prev = 0;
    for (int64_t i = 0; i < f->docidx_count; i++) {
        int64_t v = pl__ld_i64(f->docidx + 8 * i);
        if (v < prev || v > f->seq_count) {
            pl__fmt(err, errcap,
                    "%s.idx: document_indices[%lld] is %lld at offset %lld "
                    "(previous %lld, sequence_count %lld): not "
                    "non-decreasing within [0, sequence_count]",
                    f->path, (long long)i, (long long)v,
                    (long long)pl__off_docidx(f, i), (long long)prev,
                    (long long)f->seq_count);
            return PL_EDOCIDX;
        }
        prev = v;
    }
    return PL_OK;
}
