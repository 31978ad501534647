/* libFuzzer target: a WebDataset shard.  The input is written as a .tar and
 * opened as a webdataset source with an in-memory index (tar headers, GNU
 * long names, pax records, sample grouping, image headers, JSON and text
 * captions); every sample is then measured, read as tokens and decoded in
 * both image modes, with a small pixel limit so no input allocates much. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_enter_tmpdir();
    fz_write("shard.tar", data, size);
    for (int mode = 1; mode <= 2; mode++) {
        pl_image_options io = {0};
        io.mode = (pl_image_mode)mode;
        io.token_id = 300;
        io.size = 28;
        io.limit_pixels = 1 << 16;
        io.max_pixels = 56 * 56 * 4;
        if (size && (data[size - 1] & 1)) memcpy(io.caption_key, "json:caption", 13);
        pl_source_options o = {0};
        o.version = PL_SOURCE_OPTIONS_VERSION;
        o.type = PL_SOURCE_WEBDATASET;
        o.path = "shard.tar";
        o.eos_id = mode == 2 ? 2 : -1;
        o.write_index = -1;
        o.image = &io;
        pl_source *s = NULL;
        if (pl_source_open(&o, &s) == PL_OK) {
            int64_t n = pl_source_num_documents(s);
            for (int64_t i = 0; i < n && i < 16; i++) {
                int64_t len = 0, tok[64];
                pl_image_info in;
                if (pl_source_document_length(s, i, &len) == PL_OK && len > 0)
                    pl_source_read(s, i, 0, len < 64 ? len : 64, tok, PL_DTYPE_INT64);
                if (pl_source_image_info(s, i, &in) == PL_OK && in.bytes <= (1u << 22)) {
                    uint8_t *px = malloc(in.bytes ? in.bytes : 1);
                    if (!px) abort();
                    pl_source_read_image(s, i, px, in.bytes, &in);
                    free(px);
                }
            }
        }
        pl_source_free(s);
    }
    return 0;
}
