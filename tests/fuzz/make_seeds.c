/*
 * make_seeds -- writes the seed corpora of the fuzz targets into
 * OUTDIR/<target>/ (tests/fuzz/corpus in the tree): valid inputs of each
 * decoder, made by the library's own writers over the fuzzers' corpus, so
 * the fuzzers start behind every magic, length and CRC check.
 *   make_seeds OUTDIR
 */
#include "fuzz_common.h"

#include <sys/stat.h>

static char out[1024];

static void seed(const char *target, int k, const void *data, size_t n) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", out, target);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/seed_%02d", out, target, k);
    fz_write(p, data, n);
}

/* A 2x2 red PNG (as Pillow writes it), for a webdataset shard. */
static const uint8_t PNG2x2[] = {
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x08, 0x02, 0x00, 0x00, 0x00, 0xFD, 0xD4, 0x9A,
    0x73, 0x00, 0x00, 0x00, 0x16, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0xFC, 0xCF, 0xC0, 0xC0,
    0xC0, 0xC0, 0xC0, 0xC4, 0xC0, 0xC0, 0xC0, 0xC0, 0xC0, 0x00, 0x00, 0x0D, 0x1D, 0x01, 0x03, 0x6A,
    0xC2, 0x9B, 0xE9, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
};

static void tar_add(FILE *f, const char *name, const void *data, size_t n) {
    uint8_t h[512] = {0};
    snprintf((char *)h, 100, "%s", name);
    snprintf((char *)h + 124, 12, "%011zo", n);
    h[156] = '0';
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    fwrite(h, 1, 512, f);
    fwrite(data, 1, n, f);
    static const uint8_t zero[1024];
    fwrite(zero, 1, (512 - n % 512) % 512, f);
}

static void *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) abort();
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)len + 8);
    if (fread(b, 1, (size_t)len, f) != (size_t)len) abort();
    fclose(f);
    *n = (size_t)len;
    return b;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds OUTDIR\n");
        return 2;
    }
    if (!realpath(argv[1], out)) {
        mkdir(argv[1], 0755);
        if (!realpath(argv[1], out)) return 2;
    }
    fz_enter_tmpdir();
    fz_write_corpus();

    /* Megatron: u32 .bin size, then the .idx. */
    for (int k = 0; k < 3; k++) {
        int64_t lens[5] = {3, 0, 17, 1, 9};
        int dt[3] = {PL_DTYPE_UINT16, PL_DTYPE_INT32, PL_DTYPE_UINT8};
        if (plf_write_megatron("mg", dt[k], 5, lens, 0)) abort();
        size_t ni = 0, nb = 0;
        uint8_t *idx = slurp("mg.idx", &ni);
        free(slurp("mg.bin", &nb));
        uint8_t *b = malloc(ni + 4);
        uint32_t bin = (uint32_t)nb;
        memcpy(b, &bin, 4);
        memcpy(b + 4, idx, ni);
        seed("fuzz_megatron", k, b, ni + 4);
        free(b);
        free(idx);
    }
    /* llm.c shards, uint16 and uint32 tokens, eos 7. */
    for (int k = 0; k < 2; k++) {
        int64_t tok[40];
        for (int i = 0; i < 40; i++) tok[i] = i % 9 == 0 ? 7 : 100 + i;
        if (plf_write_llmc("shard.bin", k, tok, 40)) abort();
        size_t n = 0;
        void *b = slurp("shard.bin", &n);
        seed("fuzz_llmc", k, b, n);
        free(b);
    }
    /* .plidx of a flat file, header bit set so the harness fixes it. */
    {
        int64_t tok[64];
        for (int i = 0; i < 64; i++) tok[i] = i % 10 == 9 ? 0 : 1 + i;
        if (plf_write_flat("f.bin", PL_DTYPE_UINT16, tok, 64)) abort();
        pl_source_options o = {0};
        o.version = PL_SOURCE_OPTIONS_VERSION;
        o.type = PL_SOURCE_FLAT;
        o.path = "f.bin";
        pl_source *s = NULL;
        if (pl_source_open(&o, &s)) abort();
        pl_source_free(s);
        size_t n = 0;
        uint8_t *b = slurp("f.bin.plidx", &n);
        b[20] |= 1;
        seed("fuzz_plidx", 0, b, n);
        free(b);
    }
    /* Source-loader replies: megatron rows, and webdataset rows with images
     * (whole run, cut run, caption only). */
    {
        FILE *f = fopen("w.tar", "wb");
        tar_add(f, "a.png", PNG2x2, sizeof PNG2x2);
        tar_add(f, "a.txt", "red", 3);
        tar_add(f, "b.png", PNG2x2, sizeof PNG2x2);
        tar_add(f, "b.txt", "red too", 7);
        static const uint8_t zero[1024];
        fwrite(zero, 1, 1024, f);
        fclose(f);
        pl_image_options io = {0};
        io.mode = PL_IMAGE_NATIVE;
        io.token_id = 300;
        io.min_pixels = 28 * 28;
        io.max_pixels = 56 * 56;
        pl_source_options o = {PL_SOURCE_OPTIONS_VERSION, PL_SOURCE_WEBDATASET, "w.tar", "w", 0,
                               -1, PL_INDEX_MEMORY, &io};
        pl_source *src[2] = {NULL, NULL};
        if (pl_source_open(&o, &src[1])) abort();
        pl_source_options m = {0};
        m.version = PL_SOURCE_OPTIONS_VERSION;
        m.type = PL_SOURCE_MEGATRON;
        m.path = "src0";
        if (pl_source_open(&m, &src[0])) abort();
        const pl_read rd[2][3] = {{{0, 0, 0, 0, 5}, {0, 0, 3, 2, 4}, {0, 0, 1, 0, 1}},
                                  {{1, 0, 0, 0, 3}, {1, 0, 1, 0, 1}, {1, 0, 0, 2, 2}}};
        for (int k = 0; k < 2; k++) {
            size_t n = 0;
            if (pl_reply_encode(src, 2, rd[k], 3, NULL, 0, &n)) abort();
            void *b = malloc(n);
            if (pl_reply_encode(src, 2, rd[k], 3, b, n, &n)) abort();
            seed("fuzz_reply", k, b, n);
            free(b);
        }
        pl_source_free(src[0]);
        pl_source_free(src[1]);
    }
    /* Configs. */
    seed("fuzz_config", 0, FZ_CONFIG, strlen(FZ_CONFIG));
    {
        const char *y =
            "seq_length: 128\nglobal_batch_size: 16\nmicro_batch_size: 2\n"
            "train_steps: 10\ndtype: int32\npad_id: 3\nlong_documents: truncate\n"
            "packing: concat_chunk\ncost: {preset: sliding_window, window: 32}\n"
            "long_short: {threshold: 100}\ntopology: {dp: 2, pp: 2, tp: 2, order: tp-cp-ep-dp-pp}\n"
            "threads: 1\nprefetch: 2\n"
            "sources:\n  - {name: a, type: megatron, path: src0, weight: 1}\n"
            "  - {name: b, type: megatron, path: \"src*\", weight: 0.0}\n"
            "schedule:\n  interpolation: step\n  points:\n"
            "    - {step: 0, weights: {a: 0.8, b: 0.2}}\n"
            "    - {step: 5, weights: {a: 0.5, b: 0.5}}\n";
        seed("fuzz_config", 1, y, strlen(y));
        const char *z =
            "seq_length: 64\nglobal_batch_size: 4\nsplit: 969,30,1\n"
            "sources:\n  - {name: a, type: megatron, path: src0, weight: 1, split: '8,1,1'}\n"
            "  - {name: b, type: megatron, path: src1, weight: 0.5}\n"
            "valid_sources:\n  - {name: v, type: megatron, path: src0, weight: 2}\n"
            "schedule:\n  points:\n    - {step: 0, weights: {a: 1}}\n";
        seed("fuzz_config", 2, z, strlen(z));
    }
    /* State blobs and plans of the fuzzers' config, at several steps. */
    {
        pl_config *cfg = fz_config();
        pl_source *src[3];
        for (int s = 0; s < 3; s++)
            if (pl__config_open_source(cfg, s, &src[s])) abort();
        pl_planner *p = NULL;
        if (pl_planner_create(cfg, src, 3, &p)) abort();
        int ks = 0, kp = 0;
        for (int step = 0; step < 12; step++) {
            if (step == 0 || step == 3 || step == 11) {
                size_t n = 0;
                pl_planner_get_state(p, NULL, 0, &n);
                void *b = malloc(n);
                if (pl_planner_get_state(p, b, n, &n)) abort();
                seed("fuzz_state", ks++, b, n);
                free(b);
            }
            size_t sn = 0;
            pl_planner_get_state(p, NULL, 0, &sn);
            void *st = malloc(sn);
            if (pl_planner_get_state(p, st, sn, &sn)) abort();
            pl_plan *plan = NULL;
            if (pl_planner_next(p, &plan)) abort();
            if (step == 1 || step == 6) { /* packages of DP ranks 0 and 1 */
                for (int64_t dp = 0; dp < 2; dp++) {
                    int64_t nr = 0;
                    pl_plan_step_reads(plan, dp, NULL, 0, &nr);
                    pl_read *rd = calloc((size_t)nr + 1, sizeof *rd);
                    pl_payload *pay = calloc((size_t)nr + 1, sizeof *pay);
                    pl_plan_step_reads(plan, dp, rd, nr, &nr);
                    for (int64_t j = 0; j < nr; j++) {
                        pl_source *s = src[rd[j].source];
                        size_t es = pl_dtype_size(pl_source_token_dtype(s));
                        void *buf = malloc((size_t)rd[j].count * es + 1);
                        if (pl_source_read_raw(s, &rd[j], 1, buf, (size_t)rd[j].count * es)) abort();
                        pay[j] = (pl_payload){buf, pl_source_token_dtype(s), 0, rd[j].count};
                    }
                    size_t n = 0;
                    if (pl_package_encode(plan, dp, st, sn, pay, nr, NULL, 0, &n)) abort();
                    void *b = malloc(n);
                    if (pl_package_encode(plan, dp, st, sn, pay, nr, b, n, &n)) abort();
                    seed("fuzz_package", (int)(step * 2 + dp), b, n);
                    free(b);
                    for (int64_t j = 0; j < nr; j++) free((void *)pay[j].data);
                    free(pay);
                    free(rd);
                }
            }
            free(st);
            if (step == 0 || step == 5 || step == 10) {
                size_t n = 0;
                pl_plan_encode(plan, NULL, 0, &n);
                void *b = malloc(n);
                if (pl_plan_encode(plan, b, n, &n)) abort();
                seed("fuzz_plan", kp++, b, n);
                free(b);
            }
            pl_plan_free(plan);
        }
        pl_planner_free(p);
        for (int s = 0; s < 3; s++) pl_source_free(src[s]);
        pl_config_free(cfg);
    }
    return 0;
}
