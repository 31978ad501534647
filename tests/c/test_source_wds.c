/*
 * WebDataset sources in C (so ctest runs them under ASan/UBSan too): tar
 * shards written here with PNGs encoded by libspng, brace patterns, the
 * .plwds sidecar (written, reused, rebuilt after a change), the fused
 * tokens, image info in both modes, decoded pixels of a two-colour image,
 * Qwen2-VL patch order, and bad input (checksum, missing caption, skip).
 */
#include "fixtures.h"
#include "testutil.h"

#include <spng.h>
#include <sys/stat.h>
#include <unistd.h>

#define IMG 300

/* An RGB PNG of w x h: left half red (200, 10, 10), right half blue. */
static size_t make_png(int w, int h, void **out) {
    uint8_t *px = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = px + ((size_t)y * w + x) * 3;
            int left = x < w / 2;
            p[0] = left ? 200 : 10;
            p[1] = 10;
            p[2] = left ? 10 : 200;
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

/* Append a ustar member. */
static pl_source *open_wds(const char *path, int mode, int write_index, int *rc) {
    pl_image_options io = {0};
    io.mode = (pl_image_mode)mode;
    io.token_id = IMG;
    io.size = 28;
    io.min_pixels = 28 * 28;
    io.max_pixels = 56 * 56;
    pl_source_options o = {PL_SOURCE_OPTIONS_VERSION, PL_SOURCE_WEBDATASET, path, "w", 0,
                           -1, write_index, &io};
    pl_source *s = NULL;
    *rc = pl_source_open(&o, &s);
    return s;
}

int main(void) {
    const char *dir = pl_test_tmpdir();
    char p0[512], p1[512], pat[600], side[600];
    void *png = NULL, *png2 = NULL;
    size_t n = make_png(60, 20, &png), n2 = make_png(56, 56, &png2);
    snprintf(p0, sizeof p0, "%s/s-000.tar", dir);
    snprintf(p1, sizeof p1, "%s/s-001.tar", dir);
    FILE *f = fopen(p0, "wb");
    plf_tar_add(f, "a.png", png, n);
    plf_tar_add(f, "a.txt", "hi", 2);
    plf_tar_add(f, "a.cls", "7", 1); /* ignored member */
    plf_tar_end(f);
    f = fopen(p1, "wb");
    plf_tar_add(f, "b.txt", "yo!", 3);
    plf_tar_add(f, "b.png", png2, n2);
    plf_tar_end(f);
    snprintf(pat, sizeof pat, "%s/s-{000..001}.tar", dir);

    int rc;
    pl_source *s = open_wds(pat, PL_IMAGE_FIXED, 0, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_documents(s), 2);
    CHECK_EQ_I64(pl_source_num_files(s), 2);
    snprintf(side, sizeof side, "%s.plwds", p0);
    struct stat st0;
    CHECK(stat(side, &st0) == 0);
    /* Fixed 28 / patch 14: 4 visual tokens, then the caption's bytes. */
    int64_t len = 0, tok[8];
    CHECK_OK(pl_source_document_length(s, 0, &len));
    CHECK_EQ_I64(len, 4 + 2);
    CHECK_OK(pl_source_read(s, 0, 0, 6, tok, PL_DTYPE_INT64));
    CHECK_EQ_I64(tok[0], IMG);
    CHECK_EQ_I64(tok[3], IMG);
    CHECK_EQ_I64(tok[4], 'h');
    CHECK_EQ_I64(tok[5], 'i');
    CHECK_OK(pl_source_read(s, 1, 4, 3, tok, PL_DTYPE_INT64));
    CHECK_EQ_I64(tok[2], '!');
    CHECK_EQ_I64(pl_source_read(s, 1, 5, 3, tok, PL_DTYPE_INT64), PL_ERANGE);
    pl_image_info in;
    CHECK_OK(pl_source_image_info(s, 0, &in));
    CHECK_EQ_I64(in.width, 60);
    CHECK_EQ_I64(in.height, 20);
    CHECK_EQ_I64(in.tokens, 4);
    CHECK_EQ_I64((int64_t)in.bytes, 3 * 28 * 28);
    /* Centre crop of a red|blue image: left column red, right column blue. */
    uint8_t px[3 * 28 * 28];
    CHECK_OK(pl_source_read_image(s, 0, px, sizeof px, NULL));
    CHECK(px[0] > 180 && px[2 * 784] < 30);                   /* (0, 0) red */
    CHECK(px[27] < 30 && px[2 * 784 + 27] > 180);             /* (0, 27) blue */
    CHECK_EQ_I64(pl_source_read_image(s, 0, px, 10, NULL), PL_EINVAL);
    pl_source_free(s);

    /* Reused: the sidecar is not rewritten by a second open. */
    s = open_wds(pat, PL_IMAGE_FIXED, 0, &rc);
    CHECK_OK(rc);
    struct stat st1;
    CHECK(stat(side, &st1) == 0 && st1.st_ino == st0.st_ino);
    pl_source_free(s);

    /* Native: 60x20 -> smart_resize(20, 60, 28, 784, 3136) = 28x56, grid 2x4. */
    s = open_wds(pat, PL_IMAGE_NATIVE, -1, &rc);
    CHECK_OK(rc);
    CHECK_OK(pl_source_image_info(s, 0, &in));
    CHECK_EQ_I64(in.out_height, 28);
    CHECK_EQ_I64(in.out_width, 56);
    CHECK_EQ_I64(in.grid_h, 2);
    CHECK_EQ_I64(in.grid_w, 4);
    CHECK_EQ_I64(in.tokens, 2);
    uint8_t *pt = malloc(in.bytes);
    CHECK_OK(pl_source_read_image(s, 0, pt, in.bytes, NULL));
    /* Patch order: merge block (0,0) holds patches (0,0) (0,1) (1,0) (1,1), all in
     * the red left half; block (0,1) the blue right half.  Row k, channel c at
     * k*588 + c*196. */
    for (int k = 0; k < 4; k++) CHECK(pt[k * 588] > 180 && pt[k * 588 + 2 * 196] < 30);
    for (int k = 4; k < 8; k++) CHECK(pt[k * 588] < 30 && pt[k * 588 + 2 * 196] > 180);
    free(pt);
    pl_source_free(s);

    /* A bad checksum: the header's offset is named. */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/bad.tar", dir);
    f = fopen(bad, "wb");
    plf_tar_add(f, "a.png", png, n);
    plf_tar_add(f, "a.txt", "hi", 2);
    plf_tar_end(f);
    f = fopen(bad, "r+b");
    fseek(f, 3, SEEK_SET);
    fputc('Z', f);
    fclose(f);
    s = open_wds(bad, PL_IMAGE_FIXED, -1, &rc);
    CHECK_EQ_I64(rc, PL_ERECORD);
    CHECK(strstr(pl_source_errmsg(s), "tar header at offset 0: checksum") != NULL);
    pl_source_free(s);

    /* Missing caption: an error naming the member; skipped and counted through a
     * config with on_error: skip. */
    f = fopen(bad, "wb");
    plf_tar_add(f, "a.png", png, n);
    plf_tar_add(f, "b.png", png, n);
    plf_tar_add(f, "b.txt", "ok", 2);
    plf_tar_end(f);
    s = open_wds(bad, PL_IMAGE_FIXED, -1, &rc);
    CHECK_EQ_I64(rc, PL_ERECORD);
    CHECK(strstr(pl_source_errmsg(s), "member a.png at offset 0") != NULL);
    CHECK(strstr(pl_source_errmsg(s), "no caption") != NULL);
    pl_source_free(s);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "on_error: skip\nglobal_batch_size: 1\nsources:\n"
             "  - {name: w, type: webdataset, path: '%s', index: memory,\n"
             "     image: {token_id: %d, size: 28}}\n",
             bad, IMG);
    pl_config *cfg = NULL;
    CHECK_OK(pl_config_parse_string(yaml, strlen(yaml), "<test>", &cfg));
    CHECK_OK(pl_config_open_source(cfg, 0, &s));
    CHECK_EQ_I64(pl_source_num_documents(s), 1);
    CHECK_EQ_I64(pl_source_num_skipped(s), 1);
    pl_source_free(s);
    pl_config_free(cfg);

    /* Probes. */
    int64_t w = 0, h = 0;
    CHECK_OK(pl_image_probe(png2, n2, &w, &h, NULL, 0));
    CHECK_EQ_I64(w, 56);
    CHECK_EQ_I64(pl_image_probe(png2, 20, &w, &h, NULL, 0), PL_ETRUNC);
    CHECK_EQ_I64(pl_image_probe("GIF89a......", 12, &w, &h, NULL, 0), PL_EIMAGE);
    int64_t rh, rw;
    CHECK_OK(pl_image_smart_resize(300, 451, 28, 3136, 1003520, &rh, &rw));
    CHECK_EQ_I64(rh, 308);
    CHECK_EQ_I64(rw, 448);
    free(png);
    free(png2);
    TEST_END();
}
