/*
 * build/images.c -- the image fields of a micro-batch (polyload.h,
 * pl_batch): after the rows are built from tokens, every chunk of a
 * webdataset source that holds its sample's image placeholder run gets the
 * image decoded and resized into pixel_values, in row-major order of the
 * micro-batch (row, then position in the row), with its grid and its place.
 *
 * A sample's document is [token_id x N visual tokens][caption][eos], so the
 * run is positions [0, N) of the document.  A chunk that holds part of it
 * (a long document split across sequences) cannot feed an encoder: that is
 * an error naming the sample (configure seq_length above the longest sample,
 * or long_documents: truncate, which keeps the start).  Labels of the run
 * but its last position (which predicts the first caption token) are -100
 * with loss_mask 0: image placeholders are not predicted.
 *
 * The buffers grow with the largest micro-batch seen (realloc) and are
 * reused through the batch pool.  Decoding runs on the builder's thread:
 * the embedded loader's workers decode in parallel.  On the trainer side of
 * a deployment the pixels come decoded in the package (pl_payload_image,
 * decoded by the source loaders) and are copied after their record is
 * checked against the config.  Under CP the image
 * fields are not built (the config refuses webdataset sources with cp > 1).
 */
#include "build/build.h"

#include <stdlib.h>
#include <string.h>

static int grow_images(pl__batchbuf *buf, int64_t n, size_t bytes) {
    pl_batch *b = &buf->b;
    if (n > buf->img_cap) {
        int64_t nc = buf->img_cap ? buf->img_cap : 8;
        while (nc < n) nc *= 2;
        int64_t *g = pl__realloc(b->image_grid_thw, (size_t)nc * 3 * sizeof *g);
        if (!g) return PL_ENOMEM;
        b->image_grid_thw = g;
        int64_t *p = pl__realloc(b->image_positions, (size_t)nc * 2 * sizeof *p);
        if (!p) return PL_ENOMEM;
        b->image_positions = p;
        buf->img_cap = nc;
    }
    if (bytes > buf->pix_cap) {
        size_t nc = buf->pix_cap ? buf->pix_cap : (size_t)1 << 20;
        while (nc < bytes) nc *= 2;
        uint8_t *px = pl__realloc(b->pixel_values, nc);
        if (!px) return PL_ENOMEM;
        b->pixel_values = px;
        buf->pix_cap = nc;
    }
    return PL_OK;
}

/*
 * The image of chunk `ordinal` of the micro-batch from a package (the
 * trainer side of a deployment, no source open here): its record is checked
 * against the source's image options before use, so bytes from another
 * process decide nothing but pixel values.  *rec NULL: the chunk holds no
 * image (caption only).
 */
static int package_image(pl__build_ctx *x, int64_t ordinal, const pl_chunk *c,
                             pl_image_info *in, const pl_payload_image **rec) {
    const pl__source_cfg *sc = &x->cfg->sources[c->source];
    *rec = NULL;
    const int64_t k = ordinal < x->n_typed ? x->image_of[ordinal] : -1;
    if (k < 0) {
        if (c->offset > 0) return PL_OK; /* caption only */
        pl__fmt(x->err, x->errcap,
                "package: sample %lld of source '%s' arrived without its image",
                (long long)c->index, sc->name);
        return PL_EINVAL;
    }
    const pl_payload_image *im = &x->images[k];
    if (im->status) {
        pl__fmt(x->err, x->errcap, "%.*s", (int)(im->bytes < 480 ? im->bytes : 480),
                im->data ? (const char *)im->data : "");
        return im->status;
    }
    pl_image_options o = pl__sx(sc)->image;
    int rc = pl__wds_defaults(&o, x->err, x->errcap, sc->name);
    if (rc) return rc;
    const int64_t f = o.patch_size * o.merge_size;
    const int ok = o.mode == PL_IMAGE_FIXED
                       ? im->height == o.size && im->width == o.size
                       : im->height % f == 0 && im->width % f == 0 &&
                             im->height * im->width <= o.max_pixels;
    if (ok) pl__image_geometry(&o, im->height, im->width, in);
    if (!ok || in->tokens != im->tokens || (im->bytes && im->bytes != in->bytes)) {
        pl__fmt(x->err, x->errcap,
                "package: the image of sample %lld of source '%s' (%lld x %lld, %lld "
                "tokens) does not fit the source's image options",
                (long long)c->index, sc->name, (long long)im->height, (long long)im->width,
                (long long)im->tokens);
        return PL_EINVAL;
    }
    *rec = im;
    return PL_OK;
}

int pl__construct_images(pl__build_ctx *x, const pl_plan *plan, int64_t dp_rank,
                         int64_t mb, pl__batchbuf *buf) {
    pl_batch *b = &buf->b;
    const pl_config *cfg = x->cfg;
    const int64_t rows = plan->micro_batch_size, cols = x->cols;
    size_t used = 0;
    int64_t n = 0;
    const size_t es = pl_dtype_size(x->dtype);
    b->image_mode = 0;
    int64_t ord = 0; /* chunks so far, in pl_plan_reads order */
    for (int64_t row = 0; row < rows; row++) {
        int64_t q = plan->rank_sequences[(dp_rank * plan->micro_batches_per_rank + mb) *
                                             rows + row];
        const pl_chunk *cs = plan->chunks + plan->seq_offsets[q];
        int64_t nc = plan->seq_offsets[q + 1] - plan->seq_offsets[q], p = 0;
        for (int64_t j = 0; j < nc; p += cs[j].length, j++, ord++) {
            const pl_chunk *c = &cs[j];
            if (cfg->sources[c->source].type != PL_SOURCE_WEBDATASET) continue;
            const pl_payload_image *rec = NULL;
            pl_image_info in;
            int rc;
            if (!x->sources && x->image_of) {
                if ((rc = package_image(x, ord, c, &in, &rec))) return rc;
                if (!rec) continue;
            } else if (!x->sources) {
                pl__fmt(x->err, x->errcap,
                        "constructor: source '%s' is a webdataset, whose images are "
                        "decoded where the sources are open; pl_constructor_build's "
                        "int64 payloads carry no pixels (use packages)",
                        cfg->sources[c->source].name);
                return PL_EINVAL;
            } else if ((rc = pl__source_image_info(x->sources[c->source], c->index, &in, x->err,
                                                x->errcap))) {
                return rc;
            }
            const int64_t N = in.tokens;
            if (c->offset >= N) continue; /* caption only */
            if (c->offset > 0 || c->length < N) {
                pl__fmt(x->err, x->errcap,
                        "source '%s': sample %lld: chunk [%lld, +%lld) cuts its %lld "
                        "image tokens (seq_length %lld is too short for the sample; "
                        "raise it or use long_documents: truncate)",
                        cfg->sources[c->source].name, (long long)c->index,
                        (long long)c->offset, (long long)c->length, (long long)N,
                        (long long)cfg->seq_length);
                return PL_EINVAL;
            }
            if (b->image_mode && b->image_mode != (int32_t)in.mode) {
                pl__fmt(x->err, x->errcap,
                        "micro-batch holds images of both modes (fixed and native)");
                return PL_EINVAL;
            }
            /* Before any allocation: a package's pixels are as large as the record says
             * (no pixels: only a cut run, refused above, has none). */
            if (rec && rec->bytes != in.bytes) {
                pl__fmt(x->err, x->errcap, "package: sample %lld of source '%s' arrived "
                        "without its pixels", (long long)c->index,
                        cfg->sources[c->source].name);
                return PL_EINVAL;
            }
            b->image_mode = (int32_t)in.mode;
            if ((rc = grow_images(buf, n + 1, used + in.bytes))) {
                pl__fmt(x->err, x->errcap, "constructor: out of memory for images");
                return rc;
            }
            int blank = 0;
            if (rec)
                memcpy(b->pixel_values + used, rec->data, in.bytes), blank = rec->reserved;
            else if ((rc = pl__source_read_image_or_blank(x->sources[c->source], c->index,
                                                       b->pixel_values + used, in.bytes,
                                                       &blank, x->err, x->errcap)))
                return rc;
            used += in.bytes;
            b->image_grid_thw[3 * n] = in.grid_t;
            b->image_grid_thw[3 * n + 1] = in.grid_h;
            b->image_grid_thw[3 * n + 2] = in.grid_w;
            const int64_t at = row * cols + p;
            b->image_positions[2 * n] = at;
            b->image_positions[2 * n + 1] = N;
            b->visual_tokens += N;
            if (in.mode == PL_IMAGE_NATIVE) b->n_patches += in.patches;
            b->image_height = in.out_height;
            b->image_width = in.out_width;
            b->patch_dim = in.patch_dim;
            /* A blank image in place of one that did not decode (on_error: skip):
               the sample stays (same batch layout) and none of it is learned. */
            const int64_t mute = blank ? c->length : N - 1;
            /* Image placeholders predict nothing but the first caption token. */
            for (int64_t t = 0; t < mute; t++) {
                b->loss_mask[at + t] = 0.0f;
                if (es == 8)
                    ((int64_t *)b->labels)[at + t] = -100;
                else
                    ((int32_t *)b->labels)[at + t] = -100;
            }
            n++;
        }
    }
    b->n_images = n;
    if (!n) b->image_height = b->image_width = b->patch_dim = 0;
    return PL_OK;
}
