/* libFuzzer target: the PLRR source-loader reply (pl_reply_decode), as a data
 * constructor checks it before building packages; the input as it is and
 * resealed (its u64 length at offset 8 and XXH3-64 tail made right, so
 * mutations reach the tables behind the checksum).  Every byte a decoded
 * row or image points to is read, so ASan catches a pointer outside the
 * buffer. */
#include "fuzz_common.h"

static uint8_t *resealed_reply(const uint8_t *data, size_t size) {
    if (size < 40) return NULL;
    uint8_t *b = malloc(size);
    memcpy(b, data, size);
    uint64_t n = size;
    memcpy(b + 8, &n, 8);
    uint64_t h = pl__hash64(b, size - 8, 0);
    memcpy(b + size - 8, &h, 8);
    return b;
}

static volatile unsigned g_sink;

static void decode(const uint8_t *data, size_t size) {
    int64_t nr = 0, ni = 0;
    if (pl_reply_decode(data, size, NULL, 0, NULL, 0, &nr, &ni) != PL_OK) return;
    pl_payload *rows = calloc((size_t)nr + 1, sizeof *rows);
    pl_payload_image *im = calloc((size_t)ni + 1, sizeof *im);
    if (pl_reply_decode(data, size, rows, nr, im, ni, &nr, &ni) != PL_OK) abort();
    unsigned s = 0;
    for (int64_t i = 0; i < nr; i++) {
        size_t nb = (size_t)rows[i].count * pl_dtype_size((pl_dtype)rows[i].dtype);
        for (size_t j = 0; j < nb; j++) s += ((const uint8_t *)rows[i].data)[j];
    }
    for (int64_t k = 0; k < ni; k++) {
        if (im[k].read < 0 || im[k].read >= nr) abort();
        for (size_t j = 0; j < im[k].bytes; j++) s += ((const uint8_t *)im[k].data)[j];
    }
    g_sink = s;
    free(rows);
    free(im);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *sealed = resealed_reply(data, size);
    decode(data, size);
    if (sealed) decode(sealed, size);
    free(sealed);
    return 0;
}
