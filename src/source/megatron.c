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

/* A Megatron file: the common record, then the .idx arrays (in idx_map). */
typedef struct pl__mfile {
    pl__sfile base;
    const uint8_t *tokens; /* byte 0 of the .bin (NULL: empty) */
    int64_t token_bytes;   /* bytes of the .bin */
    int64_t seq_count;
    int64_t docidx_count;
    const uint8_t *lengths;  /* int32[seq_count], unaligned */
    const uint8_t *pointers; /* int64[seq_count], unaligned */
    const uint8_t *docidx;   /* int64[docidx_count], unaligned; only while
                                open checks it (unmapped after) */
} pl__mfile;

static const unsigned char mm_magic[9] = {'M', 'M', 'I', 'D', 'I',
                                              'D', 'X', 0,   0};

/* Byte offsets of the arrays inside the .idx. */
static int64_t off_length(const pl__mfile *f, int64_t r) {
    (void)f;
    return PL__MEGATRON_HEADER + 4 * r;
}
static int64_t off_pointer(const pl__mfile *f, int64_t r) {
    return PL__MEGATRON_HEADER + 4 * f->seq_count + 8 * r;
}
static int64_t off_docidx(const pl__mfile *f, int64_t i) {
    return PL__MEGATRON_HEADER + 12 * f->seq_count + 8 * i;
}

/* Does record r end past the .bin (or point at nonsense)? */
static int past_end(const pl__mfile *f, int64_t r) {
    int64_t ptr = pl__ld_i64(f->pointers + 8 * r);
    int64_t len = pl__ld_i32(f->lengths + 4 * r);
    if (ptr < 0 || len < 0 || ptr > f->token_bytes) return 1;
    return len > (f->token_bytes - ptr) / (int64_t)f->base.width;
}

static int megatron_check_docidx(const pl__mfile *f, char *err, size_t errcap);

/* Open f->path + ".idx" / ".bin"; checks are O(1) in the document count.
 * skip_trailing: records at the end that point past the end of the .bin
 * (a truncated .bin) are left out and counted in f->skipped instead of
 * refusing the file (PL_ETRUNC). */
static int megatron_open(pl_source *src, pl__sfile *bf, int skip_trailing,
                             char *err, size_t errcap) {
    (void)src;
    pl__mfile *mf = (pl__mfile *)bf;
    pl__sfile *f = bf;
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
    if (memcmp(m, mm_magic, sizeof mm_magic) != 0) {
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
    if (code == PL_DTYPE_FLOAT64 || code == PL_DTYPE_FLOAT32) {
        /* megatron-core allows float arrays; token ids are integers, and a
           float read as one would be truncated into a wrong id. */
        pl__fmt(err, errcap,
                "%s: dtype code %u (%s) at offset 17 is not a token dtype; "
                "expected an integer code (1-5 or 8)",
                path, code, pl_dtype_name((int)code));
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
    mf->seq_count = (int64_t)s;
    mf->docidx_count = (int64_t)d;
    mf->lengths = m + PL__MEGATRON_HEADER;
    mf->pointers = m + off_pointer(mf, 0);
    mf->docidx = m + off_docidx(mf, 0);
    f->n_docs = mf->seq_count;

    if (d == 0) {
        pl__fmt(err, errcap,
                "%s: document_indices is empty (document_count 0 at offset "
                "26); it must start at 0",
                path);
        return PL_EDOCIDX;
    }
    int64_t first = pl__ld_i64(mf->docidx);
    if (first != 0) {
        pl__fmt(err, errcap,
                "%s: document_indices[0] is %lld at offset %lld, expected 0",
                path, (long long)first, (long long)off_docidx(mf, 0));
        return PL_EDOCIDX;
    }
    int64_t last = pl__ld_i64(mf->docidx + 8 * (d - 1));
    if (last != mf->seq_count) {
        pl__fmt(err, errcap,
                "%s: document_indices[%llu] is %lld at offset %lld, expected "
                "sequence_count %lld",
                path, (unsigned long long)(d - 1), (long long)last,
                (long long)off_docidx(mf, (int64_t)d - 1),
                (long long)mf->seq_count);
        return PL_EDOCIDX;
    }
    rc = megatron_check_docidx(mf, err, errcap);
    if (rc) return rc;
    /* Reads need only the lengths and pointers: unmap the whole pages after
     * them (document_indices, checked above, and the multimodal modes), so
     * that the kernel's fault-around, which maps the cached pages near a
     * fault within the mapping, does not make them resident in every
     * process that reads (8 of every 20 bytes per record). */
    {
        long pg = sysconf(_SC_PAGESIZE);
        size_t keep = (size_t)off_docidx(mf, 0);
        if (pg > 0) keep = (keep + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
        if (pg > 0 && keep < f->idx_len &&
            munmap((uint8_t *)f->idx_map + keep, f->idx_len - keep) == 0)
            f->idx_map_len = keep;
        mf->docidx = NULL;
    }

    pl__fmt(path, sizeof path, "%s.bin", f->path);
    int fd = -1;
    rc = pl__map_any(f, path, 0, &f->data_map, &f->data_len, &st, &fd, err, errcap);
    if (rc) return rc;
    pl__fwatch_keep(&f->data_w, fd, &st);
    mf->tokens = f->data_map;
    mf->token_bytes = (int64_t)f->data_len;

    /* The .bin must reach the end of the last sequence.  A pointer or length
     * that is nonsense on its own is left to the per-document check. */
    if (mf->seq_count > 0) {
        int64_t r = mf->seq_count - 1;
        int64_t ptr = pl__ld_i64(mf->pointers + 8 * r);
        int64_t len = pl__ld_i32(mf->lengths + 4 * r);
        if (ptr >= 0 && len >= 0 && ptr <= INT64_MAX / 2) {
            int64_t end = ptr + len * (int64_t)f->width;
            if (end > mf->token_bytes && skip_trailing) {
                /* A truncated .bin: leave out the records at the end that
                   point past it, the same on every rank. */
                while (r >= 0 && past_end(mf, r)) r--;
                f->n_docs = r + 1;
                f->skipped = mf->seq_count - f->n_docs;
            } else if (end > mf->token_bytes) {
                pl__fmt(err, errcap,
                        "%s: truncated at offset %lld: the last sequence "
                        "(record %lld, pointer at %s.idx offset %lld) ends at "
                        "byte %lld",
                        path, (long long)mf->token_bytes, (long long)r,
                        f->path, (long long)off_pointer(mf, r),
                        (long long)end);
                return PL_ETRUNC;
            }
        }
    }
    return PL_OK;
}

/* Local document r: pointer to its first token and its length, with the
 * PL_EBOUNDS checks of that record. */
static int megatron_doc(const pl_source *src, const pl__sfile *bf, int64_t r,
                            const uint8_t **tokens, int64_t *length, char *err,
                            size_t errcap) {
    (void)src;
    const pl__mfile *f = (const pl__mfile *)bf;
    int64_t len = pl__ld_i32(f->lengths + 4 * r);
    int64_t ptr = pl__ld_i64(f->pointers + 8 * r);
    if (len < 0) {
        pl__fmt(err, errcap,
                "%s.idx: record %lld: negative sequence length %lld at "
                "offset %lld",
                f->base.path, (long long)r, (long long)len,
                (long long)off_length(f, r));
        return PL_EBOUNDS;
    }
    if (ptr < 0 || ptr > f->token_bytes ||
        len > (f->token_bytes - ptr) / (int64_t)f->base.width) {
        pl__fmt(err, errcap,
                "%s.idx: record %lld: sequence pointer %lld (offset %lld) "
                "with length %lld (offset %lld) is past the end of %s.bin "
                "(%lld bytes)",
                f->base.path, (long long)r, (long long)ptr,
                (long long)off_pointer(f, r), (long long)len,
                (long long)off_length(f, r), f->base.path,
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

/* Full scan of the document index (non-decreasing); PL_EDOCIDX. */
static int megatron_check_docidx(const pl__mfile *f, char *err, size_t errcap) {
    int64_t prev = 0;
    for (int64_t i = 0; i < f->docidx_count; i++) {
        int64_t v = pl__ld_i64(f->docidx + 8 * i);
        if (v < prev || v > f->seq_count) {
            pl__fmt(err, errcap,
                    "%s.idx: document_indices[%lld] is %lld at offset %lld "
                    "(previous %lld, sequence_count %lld): not "
                    "non-decreasing within [0, sequence_count]",
                    f->base.path, (long long)i, (long long)v,
                    (long long)off_docidx(f, i), (long long)prev,
                    (long long)f->seq_count);
            return PL_EDOCIDX;
        }
        prev = v;
    }
    return PL_OK;
}

static void megatron_prefetch(const pl__sfile *bf, int64_t r) {
    const pl__mfile *f = (const pl__mfile *)bf;
    if (f->lengths) __builtin_prefetch(f->lengths + 4 * r);
    if (f->pointers) __builtin_prefetch(f->pointers + 8 * r);
}

static int megatron_init(pl_source *src, const pl_source_options *opts,
                             int skip_damaged, char *err, size_t errcap) {
    (void)skip_damaged;
    int rc = pl__source_init_common(src, opts, 0, 1, err, errcap);
    src->dtype = PL_DTYPE_INT32;
    return rc;
}

static int megatron_expand(const pl_source *src, const char *path, pl__paths *out,
                               char *err, size_t errcap) {
    (void)src;
    return pl__expand_paths(path, 1, out, err, errcap);
}

const pl__source_ops pl__megatron_ops = {
    .version = PL__SOURCE_OPS_VERSION,
    .type = PL_SOURCE_MEGATRON,
    .name = "megatron",
    .flags = PL__SRC_GUARD_INDEX,
    .file_size = sizeof(pl__mfile),
    .data_suffix = ".bin",
    .index_suffix = ".idx",
    .unit = "record",
    .init = megatron_init,
    .expand = megatron_expand,
    .open_file = megatron_open,
    .doc = megatron_doc,
    .prefetch = megatron_prefetch,
};
