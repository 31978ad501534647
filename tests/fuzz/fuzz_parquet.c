/* libFuzzer target: Parquet sources (source/text/text.c over src/source/text/parquet_shim.cc,
 * Apache Arrow's C++ Parquet reader).  Byte 0: bit 0 on_error: skip (a file
 * that cannot be opened is left out), bit 1 a 16-byte max_record_bytes,
 * bit 2 text_key "body" instead of "text"; the rest is the .parquet file.
 * Opens with the byte tokenizer and walks every document: length, a read of
 * the whole document (or its first 4096 tokens) and of its last token.
 * What is checked: the shim's footer and schema checks (magic, footer
 * length, column chunk ranges, a top-level string column), the lazy row
 * group decode (nulls, damaged pages), the UTF-8 and size checks; Arrow's
 * own code runs uninstrumented (the pyarrow wheel's prebuilt libraries). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_enter_tmpdir();
    if (size < 1) return 0;
    const int mode = data[0];
    fz_write("f.parquet", data + 1, size - 1);
    pl_tokenizer tok;
    pl_tokenizer_bytes(&tok);
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_PARQUET;
    o.path = "f.parquet";
    o.eos_id = -1;
    o.tokenizer = &tok;
    o.add_eos = 1;
    o.tokenizer_threads = 1;
    o.text_key = (mode & 4) ? "body" : "text";
    o.max_record_bytes = (mode & 2) ? 16 : 0;
    pl_source *src = NULL;
    if (pl__source_open(&o, (mode & 1) != 0, &src) == PL_OK) {
        int64_t n = pl_source_num_documents(src);
        if (n > 2048) n = 2048;
        int64_t buf[4096];
        for (int64_t i = 0; i < n; i++) {
            int64_t len = 0;
            if (pl_source_document_length(src, i, &len) != PL_OK) {
                if (pl_source_read(src, i, 0, 1, buf, PL_DTYPE_INT64) == PL_OK) abort();
                continue;
            }
            if (len < 2) abort(); /* a non-empty text and the eos */
            int64_t c = len < 4096 ? len : 4096;
            if (pl_source_read(src, i, 0, c, buf, PL_DTYPE_INT64) != PL_OK) abort();
            for (int64_t k = 0; k + 1 < c; k++)
                if (buf[k] < 0 || buf[k] > 255) abort();
            if (pl_source_read(src, i, len - 1, 1, buf, PL_DTYPE_INT64) != PL_OK ||
                buf[0] != 256)
                abort();
        }
    }
    pl_source_free(src);
    return 0;
}
