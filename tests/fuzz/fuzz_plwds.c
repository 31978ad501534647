/* libFuzzer target: the .plwds sidecar of a webdataset shard.  The shard is
 * fixed (three samples, written once, its sidecar built by the library and
 * kept as the reference); the input replaces the sidecar.  When bit 0 of
 * byte 57 (a byte of the skipped count) is set, the harness copies the
 * reference's header fields that must match (version, record size, shard
 * size and mtime, options hash) and recomputes the CRC, so the fuzzer
 * explores records and tokens behind a valid header.  Every sample is then
 * measured, read and decoded. */
#include "fuzz_common.h"

#include "source/image.h"

#include <sys/stat.h>

/* A 2x2 red PNG (as Pillow writes it). */
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

static pl_source *open_shard(int write_index) {
    pl_image_options io = {0};
    io.mode = PL_IMAGE_NATIVE;
    io.token_id = 300;
    io.min_pixels = 784;
    io.max_pixels = 3136;
    pl_source_options o = {PL_SOURCE_OPTIONS_VERSION, PL_SOURCE_WEBDATASET, "s.tar", "s",
                           0, 2, write_index, &io};
    pl_source *s = NULL;
    if (pl_source_open(&o, &s) != PL_OK) {
        pl_source_free(s);
        return NULL;
    }
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static uint8_t ref[64];
    static int ready;
    fz_enter_tmpdir();
    if (!ready) {
        FILE *f = fopen("s.tar", "wb");
        if (!f) abort();
        tar_add(f, "a.png", PNG2x2, sizeof PNG2x2);
        tar_add(f, "a.txt", "one", 3);
        tar_add(f, "b.png", PNG2x2, sizeof PNG2x2);
        tar_add(f, "b.txt", "second caption", 14);
        static const uint8_t zero[1024];
        fwrite(zero, 1, 1024, f);
        fclose(f);
        pl_source *s = open_shard(1);
        if (!s) abort();
        pl_source_free(s);
        FILE *r = fopen("s.tar.plwds", "rb");
        if (!r || fread(ref, 1, 64, r) != 64) abort();
        fclose(r);
        ready = 1;
    }
    uint8_t *b = malloc(size ? size : 1);
    memcpy(b, data, size);
    if (size >= 64 && (b[57] & 1)) {
        memcpy(b, ref, 40); /* magic, version, record size, shard size, mtime, hash */
        uint32_t crc = pl__crc32(0, b, 60);
        crc = pl__crc32(crc, b + 64, size - 64);
        memcpy(b + 60, &crc, 4);
    }
    fz_write("s.tar.plwds", b, size);
    free(b);
    /* Read-only use of the sidecar: write_index 1 would replace a bad one. */
    pl_source *s = open_shard(1);
    if (s) {
        int64_t n = pl_source_num_documents(s);
        for (int64_t i = 0; i < n && i < 8; i++) {
            int64_t len = 0, tok[32];
            pl_image_info in;
            if (pl_source_document_length(s, i, &len) == PL_OK && len > 0)
                pl_source_read(s, i, 0, len < 32 ? len : 32, tok, PL_DTYPE_INT64);
            if (pl_source_image_info(s, i, &in) == PL_OK && in.bytes <= (1u << 20)) {
                uint8_t *px = malloc(in.bytes ? in.bytes : 1);
                if (!px) abort();
                pl_source_read_image(s, i, px, in.bytes, &in);
                free(px);
            }
        }
    }
    pl_source_free(s);
    return 0;
}
