/*
 * source/text/bytes.c -- the bytes tokenizer (pl_tokenizer_bytes): one id per
 * byte, 256 the end of a document.
 */
#include "source/text/text.h"

#include <stdlib.h>
#include <string.h>

static int bytes_encode(void *ctx, int64_t n, const char *const *texts,
                            const size_t *lens, int32_t **ids,
                            int64_t *counts, char *err, size_t errcap) {
    (void)ctx;
    for (int64_t i = 0; i < n; i++) {
        ids[i] = NULL;
        counts[i] = (int64_t)lens[i];
        if (!lens[i]) continue;
        ids[i] = pl__malloc(lens[i] * sizeof(int32_t));
        if (!ids[i]) {
            for (int64_t j = 0; j < i; j++) free(ids[j]);
            pl__fmt(err, errcap, "bytes tokenizer: out of memory");
            return PL_ENOMEM;
        }
        const uint8_t *s = (const uint8_t *)texts[i];
        for (size_t j = 0; j < lens[i]; j++) ids[i][j] = s[j];
    }
    return PL_OK;
}

void pl_tokenizer_bytes(pl_tokenizer *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    out->version = PL_TOKENIZER_VERSION;
    out->encode_batch = bytes_encode;
    out->eos_id = 256;
    out->vocab_size = 257;
    out->name = "bytes";
}

