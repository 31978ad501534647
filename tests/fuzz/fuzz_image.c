/* libFuzzer target: image headers and decoders.  The input is taken as a
 * JPEG, PNG or WebP (by its signature): its header is read by
 * pl_image_probe, then decoded and resized through image.c's glue around
 * libjpeg-turbo (DCT scaling), libspng and libwebp, with a pixel limit of
 * 2^16 so a header promising gigapixels is refused before any allocation. */
#include "fuzz_common.h"

#include "source/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t w = 0, h = 0;
    char err[256];
    if (pl_image_probe(data, size, &w, &h, err, sizeof err) != PL_OK) return 0;
    int fmt = data[0] == 0xFF ? PL__IMG_JPEG : data[0] == 0x89 ? PL__IMG_PNG : PL__IMG_WEBP;
    uint8_t *out = malloc(3 << 16), *tmp = NULL;
    size_t tcap = 0;
    int64_t rh = 0, rw = 0;
    if (!out) abort();
    pl__image_decode_resize(fmt, data, size, 16, 12, 1, 1 << 16, out, &tmp, &tcap, err,
                            sizeof err);
    if (pl__smart_resize(h, w, 28, 784, 1 << 14, &rh, &rw, err, sizeof err) == PL_OK &&
        rh * rw <= (1 << 16))
        pl__image_decode_resize(fmt, data, size, rw, rh, 0, 1 << 16, out, &tmp, &tcap, err,
                                sizeof err);
    free(out);
    free(tmp);
    return 0;
}
