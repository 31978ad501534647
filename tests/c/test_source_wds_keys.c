/*
 * WebDataset keys as webdataset splits them (the member name up to the first
 * dot of its file name): a key that held a dot and a repeated image or
 * caption member are errors naming shard, member and offset, or samples
 * skipped and counted under on_error: skip; never a silent drop.
 */
#include "fixtures.h"
#include "testutil.h"

#include <spng.h>

#define IMG 300

static size_t make_png(int w, int h, void **out) {
    uint8_t *px = calloc((size_t)w * h * 3, 1);
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

/* Open `path` through a config (on_error: fail or skip). */
static pl_source *open_cfg(const char *path, int skip, int *rc) {
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "on_error: %s\nglobal_batch_size: 1\nsources:\n"
             "  - {name: w, type: webdataset, path: '%s', index: memory,\n"
             "     image: {token_id: %d, size: 28}}\n",
             skip ? "skip" : "fail", path, IMG);
    pl_config *cfg = NULL;
    CHECK_OK(pl_config_parse_string(yaml, strlen(yaml), "<test>", &cfg));
    pl_source *s = NULL;
    *rc = pl_config_open_source(cfg, 0, &s);
    pl_config_free(cfg);
    return s;
}

static void expect(const char *path, const char *const *needles, int64_t docs_skip,
                   int64_t skipped) {
    int rc;
    pl_source *s = open_cfg(path, 0, &rc);
    CHECK_EQ_I64(rc, PL_ERECORD);
    for (int i = 0; needles[i]; i++) {
        if (!strstr(pl_source_errmsg(s), needles[i]))
            fprintf(stderr, "  missing '%s' in: %s\n", needles[i], pl_source_errmsg(s));
        CHECK(strstr(pl_source_errmsg(s), needles[i]) != NULL);
    }
    pl_source_free(s);
    s = open_cfg(path, 1, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_documents(s), docs_skip);
    CHECK_EQ_I64(pl_source_num_skipped(s), skipped);
    pl_source_free(s);
}

int main(void) {
    const char *dir = pl_test_tmpdir();
    void *png = NULL;
    size_t n = make_png(28, 28, &png);
    char p[512];

    /* Keys with a dot: img.0001.* and img.0002.* are one key, "img". */
    snprintf(p, sizeof p, "%s/dots.tar", dir);
    FILE *f = fopen(p, "wb");
    plf_tar_add(f, "a.png", png, n);
    plf_tar_add(f, "a.txt", "ok", 2);
    plf_tar_add(f, "img.0001.png", png, n); /* offset 3 * 512 + 512 * ceil(n / 512) */
    plf_tar_add(f, "img.0001.txt", "x", 1);
    plf_tar_add(f, "img.0002.png", png, n);
    plf_tar_add(f, "img.0002.txt", "y", 1);
    plf_tar_end(f);
    char off[64];
    snprintf(off, sizeof off, "member img.0001.png at offset %zu", 1536 + (n + 511) / 512 * 512);
    const char *dots[] = {p, off, "key 'img'", "extension '0001.png'", "first dot", NULL};
    expect(p, dots, 1, 1);

    /* A second caption, and a second image, in one sample. */
    snprintf(p, sizeof p, "%s/repeat.tar", dir);
    f = fopen(p, "wb");
    plf_tar_add(f, "a.png", png, n);
    plf_tar_add(f, "a.txt", "one", 3);
    plf_tar_add(f, "a.txt", "two", 3);
    plf_tar_add(f, "b.png", png, n);
    plf_tar_add(f, "b.txt", "ok", 2);
    plf_tar_end(f);
    size_t a_txt2 = 512 + (n + 511) / 512 * 512 + 1024;
    char o2[96];
    snprintf(o2, sizeof o2, "member a.txt at offset %zu repeats the caption", a_txt2);
    const char *rep[] = {p, "sample a", o2, NULL};
    expect(p, rep, 1, 1);

    snprintf(p, sizeof p, "%s/repeat_img.tar", dir);
    f = fopen(p, "wb");
    plf_tar_add(f, "a.png", png, n);
    plf_tar_add(f, "a.jpg", png, n);
    plf_tar_add(f, "a.txt", "one", 3);
    plf_tar_end(f);
    const char *rep2[] = {p, "member a.jpg", "repeats the image of member a.png at offset 0",
                          NULL};
    expect(p, rep2, 0, 1);

    /* Extra members with dotted extensions beside a complete sample stay ignored,
       as other extra members are. */
    snprintf(p, sizeof p, "%s/extra.tar", dir);
    f = fopen(p, "wb");
    plf_tar_add(f, "a.png", png, n);
    plf_tar_add(f, "a.txt", "one", 3);
    plf_tar_add(f, "a.mask.png", png, n);
    plf_tar_end(f);
    int rc;
    pl_source *s = open_cfg(p, 0, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_documents(s), 1);
    pl_source_free(s);
    free(png);
    TEST_END();
}
