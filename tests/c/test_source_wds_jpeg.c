/*
 * WebDataset JPEGs whose body is truncated (the header, and so the index,
 * is fine; only a full decode finds the damage):
 *   - image.verify: true decodes every image when the index is built: an
 *     error naming shard, member and offset, or the sample left out and
 *     counted under on_error: skip;
 *   - without it, under on_error: skip, the batch that needs the image gets
 *     a blank (all-zero) image in its place, the sample kept with loss_mask 0
 *     on all its tokens, counted; the batches are the same for any thread
 *     count.  Under on_error: fail the batch fails, as before.
 */
#include "fixtures.h"
#include "testutil.h"
#include "source/source.h"

#include <jpeglib.h>

#define IMG 300
#define NS 8  /* samples; sample BAD has the truncated body */
#define BAD 3

/* A 64 x 64 JPEG of noise (so the body is long), quality 90. */
static size_t make_jpeg(unsigned seed, unsigned char **out) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    unsigned long len = 0;
    *out = NULL;
    jpeg_mem_dest(&c, out, &len);
    c.image_width = 64;
    c.image_height = 64;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 90, TRUE);
    jpeg_start_compress(&c, TRUE);
    unsigned char row[64 * 3];
    unsigned x = seed * 2654435761u + 1;
    while (c.next_scanline < 64) {
        for (int i = 0; i < 64 * 3; i++) row[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 16);
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return (size_t)len;
}

static char shard[512];
static int64_t bad_off; /* header offset of the bad member */

static void write_shard(const char *dir) {
    snprintf(shard, sizeof shard, "%s/jpeg.tar", dir);
    FILE *f = fopen(shard, "wb");
    int64_t off = 0;
    for (int i = 0; i < NS; i++) {
        unsigned char *j = NULL;
        size_t n = make_jpeg((unsigned)i, &j);
        if (i == BAD) {
            n = n * 6 / 10; /* the header stays, the scan is cut */
            bad_off = off;
        }
        char name[64];
        snprintf(name, sizeof name, "s%03d.jpg", i);
        plf_tar_add(f, name, j, n);
        off += 512 + (int64_t)(n + 511) / 512 * 512;
        snprintf(name, sizeof name, "s%03d.txt", i);
        plf_tar_add(f, name, "caption", 7);
        off += 1024;
        free(j);
    }
    static const uint8_t zero[1024];
    fwrite(zero, 1, 1024, f);
    fclose(f);
}

static pl_config *config(int skip, int verify, int threads) {
    char y[1024];
    snprintf(y, sizeof y,
             "on_error: %s\nseq_length: 16\nglobal_batch_size: 2\nmicro_batch_size: 1\n"
             "threads: %d\ntrain_steps: 8\nsources:\n"
             "  - {name: w, type: webdataset, path: '%s', index: memory,\n"
             "     image: {token_id: %d, size: 28%s}}\n",
             skip ? "skip" : "fail", threads, shard, IMG, verify ? ", verify: true" : "");
    pl_config *cfg = NULL;
    CHECK_OK(pl_config_parse_string(y, strlen(y), "<test>", &cfg));
    return cfg;
}

/* Run the loader over all its steps; a hash of every batch's fields, the
 * micro-batches that held a muted sample, and the final status. */
static int run(int skip, int threads, uint64_t *hash, int *muted, int64_t *replaced) {
    pl_config *cfg = config(skip, 0, threads);
    pl_loader *l = NULL;
    CHECK_OK(pl_loader_create(cfg, NULL, &l));
    uint64_t h = 1469598103934665603ULL;
    *muted = 0;
    const pl_batch *b;
    int rc;
    while ((rc = pl_loader_next(l, 0, &b)) == PL_OK) {
        int64_t n = b->rows * b->cols;
        const unsigned char *parts[3] = {(const unsigned char *)b->input_ids,
                                         (const unsigned char *)b->loss_mask, b->pixel_values};
        size_t lens[3] = {(size_t)n * pl_dtype_size(b->dtype), (size_t)n * sizeof(float),
                          (size_t)b->n_images * 3 * 28 * 28};
        for (int p = 0; p < 3; p++)
            for (size_t i = 0; i < lens[p]; i++) h = (h ^ parts[p][i]) * 1099511628211ULL;
        /* A muted sample: an image whose pixels are all zero, and no loss on the row. */
        for (int64_t k = 0; k < b->n_images; k++) {
            const uint8_t *px = b->pixel_values + (size_t)k * 3 * 28 * 28;
            int zero = 1;
            for (int i = 0; i < 3 * 28 * 28; i++) zero &= px[i] == 0;
            if (!zero) continue;
            int64_t at = b->image_positions[2 * k];
            float loss = 0;
            for (int64_t t = at; t < at + 4 + 7; t++) loss += b->loss_mask[t];
            CHECK(loss == 0.0f);
            (*muted)++;
        }
    }
    *hash = h;
    *replaced = 0;
    pl_loader_free(l);
    pl_config_free(cfg);
    return rc;
}

int main(void) {
    const char *dir = pl_test_tmpdir();
    write_shard(dir);

    /* The header is fine: without verification the source opens whole and the
       decode fails, naming the member. */
    pl_config *cfg = config(0, 0, 1);
    pl_source *s = NULL;
    CHECK_OK(pl_config_open_source(cfg, 0, &s));
    CHECK_EQ_I64(pl_source_num_documents(s), NS);
    uint8_t px[3 * 28 * 28];
    CHECK_EQ_I64(pl_source_read_image(s, BAD, px, sizeof px, NULL), PL_EIMAGE);
    CHECK(strstr(pl_source_errmsg(s), "member s003.jpg") != NULL);
    CHECK_OK(pl_source_read_image(s, BAD + 1, px, sizeof px, NULL));
    pl_source_free(s);
    pl_config_free(cfg);

    /* image.verify: found when the index is built. */
    cfg = config(0, 1, 1);
    CHECK_EQ_I64(pl_config_open_source(cfg, 0, &s), PL_EIMAGE);
    char want[128];
    snprintf(want, sizeof want, "member s003.jpg at offset %lld", (long long)bad_off);
    if (!strstr(pl_source_errmsg(s), want)) fprintf(stderr, "  %s\n", pl_source_errmsg(s));
    CHECK(strstr(pl_source_errmsg(s), want) != NULL);
    CHECK(strstr(pl_source_errmsg(s), shard) != NULL);
    CHECK(strstr(pl_source_errmsg(s), "verification") != NULL);
    pl_source_free(s);
    pl_config_free(cfg);
    cfg = config(1, 1, 1);
    CHECK_OK(pl_config_open_source(cfg, 0, &s));
    CHECK_EQ_I64(pl_source_num_documents(s), NS - 1);
    CHECK_EQ_I64(pl_source_num_skipped(s), 1);
    pl_source_free(s);
    pl_config_free(cfg);

    /* Decode time, on_error: skip: a blank image, no loss, counted; the same
       batches for 1 and 3 threads. */
    uint64_t h1 = 0, h3 = 0;
    int m1 = 0, m3 = 0;
    int64_t r1 = 0, r3 = 0;
    CHECK_EQ_I64(run(1, 1, &h1, &m1, &r1), PL_DONE);
    CHECK_EQ_I64(run(1, 3, &h3, &m3, &r3), PL_DONE);
    CHECK(h1 == h3);
    /* 8 steps of 2 one-sample sequences: two epochs of 8, the bad sample twice. */
    CHECK_EQ_I64(m1, 2);
    CHECK_EQ_I64(m3, 2);
    /* The count, on a source that replaced one. */
    cfg = config(1, 0, 1);
    CHECK_OK(pl_config_open_source(cfg, 0, &s));
    CHECK_EQ_I64(pl_source_num_images_replaced(s), 0);
    uint8_t *tmp = px;
    CHECK_EQ_I64(pl__source_read_image_or_blank(s, BAD, tmp, sizeof px, &m1, want, sizeof want),
                 PL_OK);
    CHECK_EQ_I64(m1, 1);
    CHECK_EQ_I64(pl_source_num_images_replaced(s), 1);
    pl_source_free(s);
    pl_config_free(cfg);
    /* on_error: fail still fails the step. */
    CHECK_EQ_I64(run(0, 1, &h1, &m1, &r1), PL_EIMAGE);
    TEST_END();
}
