/*
 * Images through a deployment, in C (so ctest runs it under ASan/UBSan):
 *  - source-loader replies (pl_reply_encode) hold the stored-width tokens of
 *    every read and the decoded image of every read that holds a sample's
 *    placeholder run; pl_reply_decode gives them back; a cut run has no
 *    pixels; corrupt or other-version replies are refused;
 *  - packages made from replies (pl_package_encode_v2) pushed into external
 *    loaders give the embedded loader's batches, pixels and image fields
 *    included, byte for byte, for every rank of dp 2 x tp 2, in native and
 *    fixed modes;
 *  - an image that fails to decode fails the same micro-batch with the same
 *    code and message in both deployments;
 *  - records that do not fit the config (size, tokens) are refused.
 */
#include "fixtures.h"
#include "planner/planner.h"
#include "testutil.h"

#include <spng.h>
#include <stdlib.h>

#define IMG 300

/* An RGB PNG of w x h with a gradient seeded by k. */
static size_t make_png(int w, int h, int k, void **out) {
    uint8_t *px = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = px + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(x * 7 + k * 31);
            p[1] = (uint8_t)(y * 5 + k * 17);
            p[2] = (uint8_t)((x ^ y) + k);
        }
    spng_ctx *c = spng_ctx_new(SPNG_CTX_ENCODER);
    spng_set_option(c, SPNG_ENCODE_TO_BUFFER, 1);
    struct spng_ihdr ih = {(uint32_t)w, (uint32_t)h, 8, SPNG_COLOR_TYPE_TRUECOLOR, 0, 0, 0};
    spng_set_ihdr(c, &ih);
    size_t len = 0;
    int e = 0;
    if (spng_encode_image(c, px, (size_t)w * h * 3, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE))
        abort();
    *out = spng_get_png_buffer(c, &len, &e);
    spng_ctx_free(c);
    free(px);
    return len;
}

/* A shard of n samples of varied sizes; sample `bad` (if >= 0) has a PNG
 * whose header is right and whose pixel data is damaged. */
static void write_shard(const char *path, int n, int bad) {
    FILE *f = fopen(path, "wb");
    for (int k = 0; k < n; k++) {
        void *png = NULL;
        size_t len = make_png(40 + 23 * (k % 5), 30 + 21 * (k % 3), k, &png);
        if (k == bad)
            for (size_t i = 45; i < len - 12; i++) ((uint8_t *)png)[i] ^= 0x5a;
        char name[32], cap[64];
        snprintf(name, sizeof name, "s%03d.png", k);
        plf_tar_add(f, name, png, len);
        snprintf(name, sizeof name, "s%03d.txt", k);
        int cl = snprintf(cap, sizeof cap, "caption number %d%s", k, k % 2 ? " and more" : "");
        plf_tar_add(f, name, cap, (size_t)cl);
        free(png);
    }
    static const uint8_t zero[1024];
    fwrite(zero, 1, 1024, f);
    fclose(f);
}

static pl_config *config(const char *shard, const char *flat, const char *image) {
    char yaml[2048];
    snprintf(yaml, sizeof yaml,
             "seed: 5\nseq_length: 48\nglobal_batch_size: 8\nmicro_batch_size: 2\n"
             "train_steps: 4\ntopology: {dp: 2, tp: 2}\nthreads: 2\n"
             "sources:\n"
             "  - {name: img, type: webdataset, path: '%s', index: memory, weight: 0.6,\n"
             "     image: {token_id: %d, %s}}\n"
             "  - {name: txt, type: flat, path: '%s', weight: 0.4}\n",
             shard, IMG, image, flat);
    pl_config *cfg = NULL;
    CHECK_OK(pl_config_parse_string(yaml, strlen(yaml), "<test>", &cfg));
    return cfg;
}

static int has(const void *data, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp((const char *)data + i, needle, k) == 0) return 1;
    return 0;
}

static uint64_t bhash(const pl_batch *b) {
    size_t n = (size_t)(b->rows * b->cols), es = pl_dtype_size(b->dtype);
    uint64_t h = pl__hash64(&b->step, 8, 1);
    h = pl__hash64(b->input_ids, n * es, h);
    h = pl__hash64(b->labels, n * es, h);
    h = pl__hash64(b->loss_mask, n * 4, h);
    h = pl__hash64(b->position_ids, n * 8, h);
    h = pl__hash64(b->cu_seqlens, (size_t)b->n_cu_seqlens * 4, h);
    int64_t im[6] = {b->image_mode, b->n_images, b->n_patches, b->image_height,
                     b->image_width, b->visual_tokens};
    h = pl__hash64(im, sizeof im, h);
    if (b->n_images) {
        size_t px = b->image_mode == PL_IMAGE_NATIVE
                        ? (size_t)(b->n_patches * b->patch_dim)
                        : (size_t)(b->n_images * 3 * b->image_height * b->image_width);
        h = pl__hash64(b->pixel_values, px, h);
        h = pl__hash64(b->image_grid_thw, (size_t)b->n_images * 24, h);
        h = pl__hash64(b->image_positions, (size_t)b->n_images * 16, h);
    }
    return h;
}

/* The package of (plan, dp) from one reply of the sources (what the source
 * loaders and the constructor do together); NULL without package when the
 * caller only wants the reply checks. */
static void *package_from_reply(pl_source **src, int64_t ns, const pl_plan *plan, int64_t dp,
                                const void *st, size_t st_len, size_t *len) {
    int64_t n = 0;
    CHECK_OK(pl_plan_step_reads(plan, dp, NULL, 0, &n));
    pl_read *reads = calloc((size_t)n + 1, sizeof *reads);
    CHECK_OK(pl_plan_step_reads(plan, dp, reads, n, &n));
    size_t rl = 0;
    CHECK_OK(pl_reply_encode(src, ns, reads, n, NULL, 0, &rl));
    void *reply = malloc(rl);
    CHECK_EQ_I64(pl_reply_encode(src, ns, reads, n, reply, rl - 1, &rl), PL_EINVAL);
    CHECK_OK(pl_reply_encode(src, ns, reads, n, reply, rl, &rl));
    /* The timed variant: the same bytes, and time only for the sources read
       (the sizing call adds none). */
    int64_t *tns = calloc((size_t)ns, sizeof *tns);
    size_t rl2 = 0;
    CHECK_OK(pl_reply_encode_timed(src, ns, reads, n, NULL, 0, &rl2, tns));
    CHECK_EQ_I64((int64_t)rl2, (int64_t)rl);
    for (int64_t s = 0; s < ns; s++) CHECK_EQ_I64(tns[s], 0);
    void *reply2 = malloc(rl);
    CHECK_OK(pl_reply_encode_timed(src, ns, reads, n, reply2, rl, &rl2, tns));
    CHECK(rl2 == rl && memcmp(reply, reply2, rl) == 0);
    for (int64_t s = 0; s < ns; s++) {
        int read = 0;
        for (int64_t i = 0; i < n; i++) read |= reads[i].source == s;
        CHECK(read ? tns[s] > 0 : tns[s] == 0);
    }
    free(reply2);
    free(tns);
    int64_t nr = 0, ni = 0;
    CHECK_OK(pl_reply_decode(reply, rl, NULL, 0, NULL, 0, &nr, &ni));
    CHECK_EQ_I64(nr, n);
    pl_payload *rows = calloc((size_t)nr + 1, sizeof *rows);
    pl_payload_image *im = calloc((size_t)ni + 1, sizeof *im);
    CHECK_OK(pl_reply_decode(reply, rl, rows, nr, im, ni, &nr, &ni));
    for (int64_t i = 0; i < n; i++) { /* tokens as pl_source_read_raw gives them */
        pl_source *s = src[reads[i].source];
        size_t es = pl_dtype_size(pl_source_token_dtype(s)), nb = (size_t)reads[i].count * es;
        void *want = malloc(nb + 1);
        CHECK_OK(pl_source_read_raw(s, &reads[i], 1, want, nb));
        CHECK(rows[i].count == reads[i].count && memcmp(rows[i].data, want, nb) == 0);
        free(want);
    }
    for (int64_t k = 0; k < ni; k++) { /* pixels as pl_source_read_image gives them */
        const pl_read *r = &reads[im[k].read];
        pl_image_info in;
        CHECK_OK(pl_source_image_info(src[r->source], r->index, &in));
        CHECK(r->offset < in.tokens && im[k].tokens == in.tokens);
        if (im[k].status == PL_OK && im[k].data) {
            uint8_t *want = malloc(in.bytes);
            CHECK_OK(pl_source_read_image(src[r->source], r->index, want, in.bytes, NULL));
            CHECK(im[k].bytes == in.bytes && memcmp(im[k].data, want, in.bytes) == 0);
            free(want);
        }
    }
    void *out = NULL;
    if (len) {
        CHECK_OK(pl_package_encode_v2(plan, dp, st, st_len, rows, nr, im, ni, NULL, 0, len));
        out = malloc(*len);
        CHECK_OK(pl_package_encode_v2(plan, dp, st, st_len, rows, nr, im, ni, out, *len, len));
        if (ni > 1) { /* images out of read order are refused */
            pl_payload_image t = im[0];
            im[0] = im[1];
            im[1] = t;
            size_t d = 0;
            CHECK_EQ_I64(pl_package_encode_v2(plan, dp, st, st_len, rows, nr, im, ni, NULL, 0, &d),
                         PL_EINVAL);
        }
    }
    free(rows);
    free(im);
    free(reply);
    free(reads);
    return out;
}

/* Every rank's external loader, fed packages made from replies, gives the
 * embedded loader's batches (or its error, at the same micro-batch). */
static void check_deployment(pl_config *cfg, int expect_error) {
    pl_source *src[2];
    for (int s = 0; s < 2; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, 2, &p));
    const int64_t steps = 4, world = pl_config_world_size(cfg);
    pl_plan *plans[5] = {0};
    void *blobs[5];
    size_t blen[5];
    for (int64_t s = 0; s <= steps; s++) {
        CHECK_OK(pl_planner_get_state(p, NULL, 0, &blen[s]));
        blobs[s] = malloc(blen[s]);
        CHECK_OK(pl_planner_get_state(p, blobs[s], blen[s], &blen[s]));
        if (s < steps) CHECK_OK(pl_planner_next(p, &plans[s]));
    }
    int64_t images = 0, errors = 0;
    for (int64_t r = 0; r < world; r++) {
        pl_rank_info ri;
        CHECK_OK(pl_config_rank_info(cfg, r, &ri));
        pl_loader_options eo = {PL_LOADER_OPTIONS_VERSION, &r, 1, 2, 3, 0, 0, 0};
        pl_loader *emb = NULL, *ext = NULL;
        CHECK_OK(pl_loader_create(cfg, &eo, &emb));
        eo.external = 1;
        CHECK_OK(pl_loader_create(cfg, &eo, &ext));
        CHECK_OK(pl_loader_set_state(ext, blobs[0], blen[0]));
        for (;;) {
            int64_t want = -1;
            while (pl_loader_want_step(ext, 0, &want) == PL_OK) {
                if (want == steps) {
                    CHECK_OK(pl_loader_push_package(ext, blobs[want], blen[want]));
                    continue;
                }
                size_t n = 0;
                void *pkg = package_from_reply(src, 2, plans[want], ri.dp_rank, blobs[want],
                                               blen[want], &n);
                CHECK_OK(pl_loader_push_package(ext, pkg, n));
                free(pkg);
            }
            const pl_batch *a = NULL, *b = NULL;
            int ra = pl_loader_next(emb, r, &a);
            char ma[PL__ERRMSG_CAP];
            snprintf(ma, sizeof ma, "%s", pl_last_errmsg());
            int rb = pl_loader_next(ext, r, &b);
            CHECK_EQ_I64(ra, rb);
            if (ra == PL_DONE) break;
            if (ra != PL_OK) {
                CHECK(strcmp(ma, pl_last_errmsg()) == 0);
                CHECK(strstr(ma, "s001.png") != NULL);
                errors++;
                break;
            }
            CHECK(bhash(a) == bhash(b));
            images += a->n_images;
        }
        pl_loader_free(emb);
        pl_loader_free(ext);
    }
    CHECK(images > 8);
    CHECK(expect_error ? errors > 0 : errors == 0);
    for (int64_t s = 0; s <= steps; s++) {
        pl_plan_free(plans[s]);
        free(blobs[s]);
    }
    pl_planner_free(p);
    for (int s = 0; s < 2; s++) pl_source_free(src[s]);
}

int main(void) {
    const char *dir = pl_test_tmpdir();
    char shard[512], badshard[512], flat[512];
    snprintf(shard, sizeof shard, "%s/good.tar", dir);
    snprintf(badshard, sizeof badshard, "%s/bad.tar", dir);
    snprintf(flat, sizeof flat, "%s/t.bin", dir);
    write_shard(shard, 24, -1);
    write_shard(badshard, 24, 1);
    /* Text: documents of 3..31 tokens, each ending with eos 0. */
    int64_t toks[800];
    int64_t nt = 0;
    for (int d = 0; nt < 760; d++) {
        int64_t len = 3 + (d * 7) % 29;
        for (int64_t t = 0; t + 1 < len; t++) toks[nt++] = 1 + (d * 13 + t) % 250;
        toks[nt++] = 0;
    }
    CHECK_OK(plf_write_flat(flat, PL_DTYPE_UINT16, toks, nt));

    const char *native = "mode: native, patch_size: 14, merge_size: 2, min_pixels: 784, "
                         "max_pixels: 6272";
    pl_config *cfg = config(shard, flat, native);
    check_deployment(cfg, 0);
    pl_config_free(cfg);
    cfg = config(shard, flat, "mode: fixed, size: 28, patch_size: 14");
    check_deployment(cfg, 0);
    pl_config_free(cfg);
    /* A damaged image: the error travels in the reply to its micro-batch. */
    cfg = config(badshard, flat, native);
    check_deployment(cfg, 1);

    /* Reply records: a cut run has no pixels; a bad image its status. */
    pl_source *src[2] = {NULL, NULL};
    CHECK_OK(pl__config_open_source(cfg, 0, &src[0]));
    pl_read rd[3] = {{0, 0, 0, 0, 3}, {0, 0, 2, 1, 1}, {0, 0, 1, 0, 4}};
    pl_image_info in, in1, in2;
    CHECK_OK(pl_source_image_info(src[0], 0, &in));
    CHECK_OK(pl_source_image_info(src[0], 1, &in1));
    CHECK_OK(pl_source_image_info(src[0], 2, &in2));
    CHECK(in2.tokens > 1);
    rd[0].count = in.tokens + 2;
    rd[2].count = in1.tokens;
    size_t rl = 0;
    CHECK_OK(pl_reply_encode(src, 1, rd, 3, NULL, 0, &rl));
    uint8_t *reply = malloc(rl);
    CHECK_OK(pl_reply_encode(src, 1, rd, 3, reply, rl, &rl));
    pl_payload rows[3];
    pl_payload_image im[3];
    int64_t nr = 0, ni = 0;
    CHECK_OK(pl_reply_decode(reply, rl, rows, 3, im, 3, &nr, &ni));
    CHECK_EQ_I64(nr, 3);
    CHECK_EQ_I64(ni, 3);
    CHECK(im[0].status == PL_OK && im[0].bytes == in.bytes && im[0].data);
    CHECK(im[1].status == PL_OK && im[1].bytes == 0 && !im[1].data); /* cut */
    CHECK_EQ_I64(im[2].status, PL_EIMAGE); /* sample 1 of the bad shard */
    CHECK(im[2].bytes > 0 && has(im[2].data, im[2].bytes, "s001.png"));
    /* Corrupt: a flipped byte, another version, a cut tail. */
    reply[rl / 2] ^= 1;
    CHECK_EQ_I64(pl_reply_decode(reply, rl, rows, 3, im, 3, &nr, &ni), PL_EINVAL);
    reply[rl / 2] ^= 1;
    reply[4] = 9;
    CHECK_EQ_I64(pl_reply_decode(reply, rl, rows, 3, im, 3, &nr, &ni), PL_EVERSION);
    reply[4] = 1;
    CHECK_EQ_I64(pl_reply_decode(reply, rl - 8, rows, 3, im, 3, &nr, &ni), PL_EINVAL);
    CHECK_OK(pl_reply_decode(reply, rl, NULL, 0, NULL, 0, &nr, &ni));
    /* A source not held, or a bad index, is an error naming it. */
    pl_read other = {1, 0, 0, 0, 1};
    CHECK_EQ_I64(pl_reply_encode(src, 2, &other, 1, NULL, 0, &rl), PL_EINVAL);
    CHECK(strstr(pl_last_errmsg(), "not held") != NULL);
    pl_read far = {0, 0, 999, 0, 1};
    CHECK_EQ_I64(pl_reply_encode(src, 1, &far, 1, NULL, 0, &rl), PL_ERANGE);
    free(reply);
    pl_source_free(src[0]);
    pl_config_free(cfg);

    /* A package whose image record does not fit the config is refused by the
     * loader that builds from it. */
    cfg = config(shard, flat, native);
    for (int s = 0; s < 2; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, 2, &p));
    size_t bl = 0;
    CHECK_OK(pl_planner_get_state(p, NULL, 0, &bl));
    void *blob = malloc(bl);
    CHECK_OK(pl_planner_get_state(p, blob, bl, &bl));
    pl_plan *plan = NULL;
    CHECK_OK(pl_planner_next(p, &plan));
    int64_t n = 0;
    CHECK_OK(pl_plan_step_reads(plan, 0, NULL, 0, &n));
    pl_read *reads = calloc((size_t)n, sizeof *reads);
    CHECK_OK(pl_plan_step_reads(plan, 0, reads, n, &n));
    CHECK_OK(pl_reply_encode(src, 2, reads, n, NULL, 0, &rl));
    reply = malloc(rl);
    CHECK_OK(pl_reply_encode(src, 2, reads, n, reply, rl, &rl));
    pl_payload *pr = calloc((size_t)n, sizeof *pr);
    pl_payload_image *pi = calloc((size_t)n, sizeof *pi);
    CHECK_OK(pl_reply_decode(reply, rl, pr, n, pi, n, &nr, &ni));
    CHECK(ni > 0);
    const char *why[3] = {"does not fit the source's image options",
                          "does not fit the source's image options",
                          "arrived without its pixels"};
    for (int t = 0; t < 3; t++) {
        pl_payload_image keep = pi[0];
        if (t == 0) {
            pi[0].tokens += 1;
        } else if (t == 1) {
            pi[0].height += 1; /* not a multiple of patch * merge */
        } else { /* a whole run without pixels: refused before any allocation */
            pi[0].data = NULL;
            pi[0].bytes = 0;
        }
        size_t pl = 0;
        CHECK_OK(pl_package_encode_v2(plan, 0, blob, bl, pr, nr, pi, ni, NULL, 0, &pl));
        void *pkg = malloc(pl);
        CHECK_OK(pl_package_encode_v2(plan, 0, blob, bl, pr, nr, pi, ni, pkg, pl, &pl));
        int64_t r0 = 0;
        pl_loader_options eo = {PL_LOADER_OPTIONS_VERSION, &r0, 1, 1, 2, 1, 1, 0};
        pl_loader *ext = NULL;
        CHECK_OK(pl_loader_create(cfg, &eo, &ext));
        CHECK_OK(pl_loader_set_state(ext, blob, bl));
        int64_t want = -1;
        CHECK_OK(pl_loader_want_step(ext, 1000, &want));
        CHECK_OK(pl_loader_push_package(ext, pkg, pl));
        const pl_batch *b = NULL;
        int rc = PL_OK;
        for (int k = 0; k < 2 && rc == PL_OK; k++) rc = pl_loader_next(ext, 0, &b);
        CHECK_EQ_I64(rc, PL_EINVAL);
        CHECK(strstr(pl_last_errmsg(), why[t]) != NULL);
        pl_loader_free(ext);
        free(pkg);
        pi[0] = keep;
    }
    free(pr);
    free(pi);
    free(reply);
    free(reads);
    free(blob);
    pl_plan_free(plan);
    pl_planner_free(p);
    for (int s = 0; s < 2; s++) pl_source_free(src[s]);
    pl_config_free(cfg);

    /* A reply of many one-token rows and no image is valid: its tables take
     * 16 bytes a row (the decoder once asked room for an image record per
     * row as well, and refused it). */
    cfg = config(shard, flat, native);
    CHECK_OK(pl__config_open_source(cfg, 1, &src[1]));
    src[0] = NULL;
    pl_read one[12];
    for (int i = 0; i < 12; i++) one[i] = (pl_read){1, 0, i, 0, 1};
    CHECK_OK(pl_reply_encode(src, 2, one, 12, NULL, 0, &rl));
    reply = malloc(rl);
    CHECK_OK(pl_reply_encode(src, 2, one, 12, reply, rl, &rl));
    CHECK(rl < 12 * (16 + 56));
    pl_payload rows12[12];
    nr = ni = -1;
    CHECK_OK(pl_reply_decode(reply, rl, rows12, 12, NULL, 0, &nr, &ni));
    CHECK_EQ_I64(nr, 12);
    CHECK_EQ_I64(ni, 0);
    for (int i = 0; i < 12; i++) {
        int64_t t = 0;
        CHECK_OK(pl_source_read_many(src[1], &one[i], 1, &t));
        CHECK(rows12[i].count == 1 && rows12[i].dtype == PL_DTYPE_UINT16 &&
              *(const uint16_t *)rows12[i].data == (uint16_t)t);
    }
    free(reply);
    pl_source_free(src[1]);
    pl_config_free(cfg);
    TEST_END();
}
