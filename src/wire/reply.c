/*
 * reply.c -- a source loader's reply to reads when images travel with the
 * tokens (pl_reply_encode / pl_reply_decode; the layout is in polyload.h).
 *
 * The design puts sample-level work in the source loaders
 * (docs/internals/design.md, "Roles"): for image-text sources that means
 * decoding and resizing, so a source-loader process answers a constructor's
 * reads with the tokens at their stored width plus the pixels of every image
 * a read holds.  The reply's size is known from the indexes before any pixel
 * is decoded (each image's slot is 3 * height * width bytes after resizing),
 * so the caller sizes one buffer and the images are decoded straight into it.
 * A decoding error does not fail the reply: it is stored as the image's
 * status and message, and the constructor's receiver reports it at the
 * micro-batch that needs the image, as the embedded loader does.
 */
#include "wire/wire.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PL__REPLY_VERSION 1u
#define PL__REPLY_HEADER 32
#define PL__REPLY_ROW 16
#define PL__REPLY_IMAGE 56

/* Per read: -1 (no image) or its image's geometry. */
typedef struct pl__rimg {
    int64_t row, tokens, height, width;
    int64_t index;
    size_t offset, bytes;
} pl__rimg;

/* The images of the reads and the layout's sizes. */
static int reply_plan(pl_source *const *sources, int64_t n_sources,
                          const pl_read *reads, int64_t n, pl__rimg **imgs,
                          int64_t *n_imgs, size_t *token_bytes, size_t *pixel_bytes,
                          char *err, size_t errcap) {
    *imgs = NULL;
    *n_imgs = 0;
    *token_bytes = *pixel_bytes = 0;
    int64_t n_wds = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t s = reads[i].source;
        if (s < 0 || s >= n_sources || !sources[s] || reads[i].count < 0) {
            pl__fmt(err, errcap, "pl_reply_encode: read %lld names source %d, not held here",
                    (long long)i, (int)s);
            return PL_EINVAL;
        }
        *token_bytes += (size_t)reads[i].count * pl_dtype_size(pl_source_token_dtype(sources[s]));
        n_wds += pl__type_has_images(pl_source_get_type(sources[s]));
    }
    pl__rimg *v = pl__calloc(n_wds ? (size_t)n_wds : 1, sizeof *v);
    if (!v) {
        pl__fmt(err, errcap, "pl_reply_encode: out of memory");
        return PL_ENOMEM;
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        pl_source *src = sources[reads[i].source];
        if (!pl__type_has_images(pl_source_get_type(src))) continue;
        pl_image_info in;
        int rc = pl__source_image_info(src, reads[i].index, &in, err, errcap);
        if (rc) {
            free(v);
            return rc;
        }
        if (reads[i].offset >= in.tokens) continue; /* caption only */
        pl__rimg *m = &v[k++];
        m->row = i;
        m->index = reads[i].index;
        m->tokens = in.tokens;
        m->height = in.out_height;
        m->width = in.out_width;
        m->offset = *pixel_bytes;
        /* The whole run: decoded.  A cut run: no pixels (the receiver says). */
        m->bytes = reads[i].offset == 0 && reads[i].count >= in.tokens ? in.bytes : 0;
        *pixel_bytes += m->bytes;
    }
    *imgs = v;
    *n_imgs = k;
    return PL_OK;
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int pl_reply_encode(pl_source *const *sources, int64_t n_sources, const pl_read *reads,
                    int64_t n, void *buf, size_t cap, size_t *len) {
    return pl_reply_encode_timed(sources, n_sources, reads, n, buf, cap, len, NULL);
}

int pl_reply_encode_timed(pl_source *const *sources, int64_t n_sources,
                          const pl_read *reads, int64_t n, void *buf, size_t cap,
                          size_t *len, int64_t *source_ns) {
    char err[PL__ERRMSG_CAP];
    if (!len || n < 0 || n_sources < 0 || (n > 0 && (!reads || !sources))) return PL_EINVAL;
    pl__rimg *imgs = NULL;
    int64_t n_imgs = 0;
    size_t tb = 0, pb = 0;
    err[0] = '\0';
    int rc = reply_plan(sources, n_sources, reads, n, &imgs, &n_imgs, &tb, &pb, err,
                            sizeof err);
    if (rc) {
        pl__thread_err(err);
        return rc;
    }
    const size_t tables = (size_t)n * PL__REPLY_ROW + (size_t)n_imgs * PL__REPLY_IMAGE;
    const size_t total = PL__REPLY_HEADER + tables + tb + pb + 8;
    *len = total;
    if (!buf) {
        free(imgs);
        return PL_OK;
    }
    if (cap < total) {
        free(imgs);
        pl__fmt(err, sizeof err, "pl_reply_encode: the reply needs %zu bytes, the buffer holds %zu",
                total, cap);
        pl__thread_err(err);
        return PL_EINVAL;
    }
    unsigned char *b = buf, *w = b;
    const uint32_t version = PL__REPLY_VERSION;
    const uint64_t t64 = total;
    const int64_t counts[2] = {n, n_imgs};
    memcpy(w, "PLRR", 4);
    memcpy(w + 4, &version, 4);
    memcpy(w + 8, &t64, 8);
    memcpy(w + 16, counts, 16);
    w += PL__REPLY_HEADER;
    for (int64_t i = 0; i < n; i++) {
        int32_t d[2] = {(int32_t)pl_source_token_dtype(sources[reads[i].source]), 0};
        memcpy(w, d, 8);
        memcpy(w + 8, &reads[i].count, 8);
        w += PL__REPLY_ROW;
    }
    unsigned char *itab = w;
    w += (size_t)n_imgs * PL__REPLY_IMAGE;
    /* With source_ns, the clock is read where the source changes (a run of
       one source's rows costs one reading) and after each image. */
    /* Remote sources: every range of the reply requested at once (one call
       per source; a no-op for local files), then read one by one. */
    for (int64_t s = 0; s < n_sources; s++)
        pl__source_ensure_reads(sources[s], reads, n, (int32_t)s);
    int64_t t_prev = source_ns ? mono_ns() : 0;
    for (int64_t i = 0; i < n && rc == PL_OK; i++) {
        pl_source *src = sources[reads[i].source];
        size_t nb = (size_t)reads[i].count * pl_dtype_size(pl_source_token_dtype(src));
        rc = pl_source_read_raw(src, &reads[i], 1, w, nb);
        if (rc) pl__fmt(err, sizeof err, "%s", pl_last_errmsg());
        w += nb;
        if (source_ns && (i + 1 == n || reads[i + 1].source != reads[i].source)) {
            int64_t t = mono_ns();
            source_ns[reads[i].source] += t - t_prev;
            t_prev = t;
        }
    }
    unsigned char *pix = w;
    for (int64_t k = 0; k < n_imgs && rc == PL_OK; k++) {
        pl__rimg *m = &imgs[k];
        int32_t status = PL_OK;
        int blank = 0;
        size_t bytes = m->bytes;
        if (source_ns) t_prev = mono_ns();
        if (bytes) {
            char derr[PL__ERRMSG_CAP];
            status = pl__source_read_image_or_blank(sources[reads[m->row].source], m->index,
                                                 pix + m->offset, m->bytes, &blank, derr,
                                                 sizeof derr);
            if (status) { /* the message takes the slot's place (truncated to it) */
                size_t ml = strlen(derr);
                bytes = ml < m->bytes ? ml : m->bytes;
                memset(pix + m->offset, 0, m->bytes);
                memcpy(pix + m->offset, derr, bytes);
            }
        }
        if (source_ns) source_ns[reads[m->row].source] += mono_ns() - t_prev;
        int64_t rec[4] = {m->row, m->tokens, m->height, m->width};
        int32_t st[2] = {status, blank ? PL_IMAGE_BLANK : 0};
        uint64_t ob[2] = {m->offset, bytes};
        unsigned char *r = itab + (size_t)k * PL__REPLY_IMAGE;
        memcpy(r, rec, 32);
        memcpy(r + 32, st, 8);
        memcpy(r + 40, ob, 16);
    }
    free(imgs);
    if (rc) {
        pl__thread_err(err);
        return rc;
    }
    w = pix + pb;
    uint64_t h = pl__hash64(b, (size_t)(w - b), 0);
    memcpy(w, &h, 8);
    return PL_OK;
}

static int token_dtype(int32_t d) { return d >= PL_DTYPE_UINT8 && d <= PL_DTYPE_UINT32; }

int pl_reply_decode(const void *buf, size_t len, pl_payload *rows, int64_t rows_cap,
                    pl_payload_image *images, int64_t images_cap, int64_t *n_rows,
                    int64_t *n_images) {
    const unsigned char *b = buf;
    if (!b || len < PL__REPLY_HEADER + 8 || memcmp(b, "PLRR", 4) != 0) return PL_EINVAL;
    uint32_t version;
    uint64_t total, h;
    int64_t counts[2];
    memcpy(&version, b + 4, 4);
    memcpy(&total, b + 8, 8);
    if (version != PL__REPLY_VERSION) return PL_EVERSION;
    if (total != len) return PL_EINVAL;
    memcpy(&h, b + len - 8, 8);
    if (h != pl__hash64(b, len - 8, 0)) return PL_EINVAL;
    memcpy(counts, b + 16, 16);
    const size_t room = len - PL__REPLY_HEADER - 8;
    /* The tables fit in the buffer: every row has its record, every image
     * its own (a reply of many short rows and no image is valid). */
    if (counts[0] < 0 || counts[1] < 0 || counts[1] > counts[0] ||
        (uint64_t)counts[0] > room / PL__REPLY_ROW ||
        (uint64_t)counts[1] > (room - (size_t)counts[0] * PL__REPLY_ROW) / PL__REPLY_IMAGE)
        return PL_EINVAL;
    const int64_t nr = counts[0], ni = counts[1];
    const unsigned char *rtab = b + PL__REPLY_HEADER;
    const unsigned char *itab = rtab + (size_t)nr * PL__REPLY_ROW;
    const unsigned char *tok = itab + (size_t)ni * PL__REPLY_IMAGE;
    const unsigned char *end = b + len - 8;
    for (int64_t i = 0; i < nr; i++) {
        int32_t d[2];
        int64_t count;
        memcpy(d, rtab + (size_t)i * PL__REPLY_ROW, 8);
        memcpy(&count, rtab + (size_t)i * PL__REPLY_ROW + 8, 8);
        size_t es = token_dtype(d[0]) ? pl_dtype_size((pl_dtype)d[0]) : 0;
        if (!es || count < 0 || (uint64_t)count > (uint64_t)(end - tok) / es) return PL_EINVAL;
        if (rows && i < rows_cap) rows[i] = (pl_payload){tok, d[0], 0, count};
        tok += (size_t)count * es;
    }
    const unsigned char *pix = tok;
    const uint64_t pixlen = (uint64_t)(end - pix);
    int64_t last = -1;
    for (int64_t k = 0; k < ni; k++) {
        const unsigned char *r = itab + (size_t)k * PL__REPLY_IMAGE;
        int64_t rec[4];
        int32_t st[2];
        uint64_t ob[2];
        memcpy(rec, r, 32);
        memcpy(st, r + 32, 8);
        memcpy(ob, r + 40, 16);
        if (rec[0] <= last || rec[0] >= nr || rec[1] <= 0 || rec[2] <= 0 || rec[3] <= 0 ||
            st[0] > 0 || (st[1] != 0 && st[1] != PL_IMAGE_BLANK) || ob[0] > pixlen || ob[1] > pixlen - ob[0] ||
            (st[0] == 0 && ob[1] &&
             (rec[2] > 65536 || rec[3] > 65536 || ob[1] != (uint64_t)(3 * rec[2] * rec[3]))))
            return PL_EINVAL;
        last = rec[0];
        if (images && k < images_cap)
            images[k] = (pl_payload_image){rec[0], rec[1], rec[2], rec[3], st[0], st[1],
                                           ob[1] ? pix + ob[0] : NULL, (size_t)ob[1]};
    }
    if (n_rows) *n_rows = nr;
    if (n_images) *n_images = ni;
    return PL_OK;
}
