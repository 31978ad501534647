/* libFuzzer target: the raw text record readers (source/text/text.c).  Byte 0
 * picks the file kind (bits 0-1: .jsonl, .jsonl.gz, .jsonl.zst, .txt; bit 2:
 * on_error: skip for damaged streams; bit 3: a small max_record_bytes), the
 * rest is the file.  .gz and .zst inputs are used as given (corrupt streams)
 * and, for bit 4, compressed from the rest first (so mutations reach the
 * JSON parser through the decoders); bit 5: instruction data (jsonl with
 * prompt_key "p" and response_key "r"), or with bit 6 as well chat data
 * (messages_key "m", a ChatML-like template).  Opens with the byte tokenizer and
 * walks every document: length, reads of the whole document and of its
 * last token, pl_source_read_many and pl_source_read_raw (instruction data:
 * the marked form of the whole document, prompt tokens as -1 - id). */
#include "fuzz_common.h"

#include <zlib.h>
#include <zstd.h>

static void walk(pl_source *src, int sft, int o_chat) {
    int64_t n = pl_source_num_documents(src);
    if (n > 512) n = 512;
    int64_t buf[4096];
    int32_t raw[4096];
    for (int64_t i = 0; i < n; i++) {
        int64_t len = 0;
        if (pl_source_document_length(src, i, &len) != PL_OK) {
            if (pl_source_read(src, i, 0, 1, buf, PL_DTYPE_INT64) == PL_OK) abort();
            continue;
        }
        if (len < 1) abort(); /* add_eos: at least the eos */
        int64_t c = len < 4096 ? len : 4096;
        if (pl_source_read(src, i, 0, c, buf, PL_DTYPE_INT64) != PL_OK) abort();
        if (buf[c - 1] != (c == len ? 256 : buf[c - 1])) abort();
        for (int64_t k = 0; k + 1 < c; k++)
            if (buf[k] < 0 || buf[k] > 255) abort();
        if (sft && c == len) {
            /* Marked form: untrained tokens as -1 - id (instruction data: a
               prompt part, then the response); something is trained. */
            int64_t m[4096];
            pl_read w = {0, 0, i, 0, c};
            if (pl_source_read_many(src, &w, 1, m) != PL_OK) abort();
            int seen_plain = 0, chat = o_chat;
            for (int64_t k = 0; k < c; k++) {
                if (m[k] < 0 ? (!chat && seen_plain) || -1 - m[k] != buf[k]
                             : m[k] != buf[k])
                    abort();
                seen_plain |= m[k] >= 0;
            }
            if (!seen_plain) abort();
        }
        /* The eos, marked (-1 - 256) where a chat record ends with a turn
           that is not trained on. */
        pl_read r = {0, 0, i, len - 1, 1};
        if (pl_source_read_many(src, &r, 1, buf) != PL_OK ||
            (buf[0] != 256 && !(o_chat && buf[0] == -257)))
            abort();
        if (pl_source_read_raw(src, &r, 1, raw, sizeof raw) != PL_OK || raw[0] != buf[0])
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_enter_tmpdir();
    if (size < 1) return 0;
    int mode = data[0];
    static const char *names[4] = {"f.jsonl", "f.jsonl.gz", "f.jsonl.zst", "f.txt"};
    const char *name = names[mode & 3];
    const uint8_t *body = data + 1;
    size_t n = size - 1;
    uint8_t *packed = NULL;
    if ((mode & 16) && (mode & 3) == 1) {
        uLongf cap = compressBound((uLong)n);
        packed = malloc(cap + 32);
        z_stream z;
        memset(&z, 0, sizeof z);
        deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
        z.next_in = (Bytef *)body;
        z.avail_in = (uInt)n;
        z.next_out = packed;
        z.avail_out = (uInt)cap + 32;
        deflate(&z, Z_FINISH);
        n = z.total_out;
        deflateEnd(&z);
        body = packed;
    } else if ((mode & 16) && (mode & 3) == 2) {
        size_t cap = ZSTD_compressBound(n);
        packed = malloc(cap);
        n = ZSTD_compress(packed, cap, body, n, 1);
        if (ZSTD_isError(n)) abort();
        body = packed;
    }
    fz_write(name, body, n);
    free(packed);
    pl_tokenizer tok;
    pl_tokenizer_bytes(&tok);
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = (mode & 3) == 3 ? PL_SOURCE_TEXT : PL_SOURCE_JSONL;
    o.path = name;
    o.eos_id = -1;
    o.tokenizer = &tok;
    o.add_eos = 1;
    o.tokenizer_threads = 1;
    o.max_record_bytes = (mode & 8) ? 64 : 0;
    const int sft = (mode & 32) && o.type == PL_SOURCE_JSONL;
    if (sft && (mode & 64)) {
        o.messages_key = "m";
        o.chat_template[0] = "<s>{content}</s>";
        o.chat_template[1] = "<u>{content}</u>";
        o.chat_template[2] = "<a>{content}</a>";
    } else if (sft) {
        o.prompt_key = "p", o.response_key = "r";
    }
    pl_source *src = NULL;
    if (pl__source_open(&o, (mode & 4) != 0, &src) == PL_OK) walk(src, sft, (mode & 64) != 0);
    pl_source_free(src);
    return 0;
}
