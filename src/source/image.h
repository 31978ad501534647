/*
 * image.h -- image headers, decoding and resizing for image-text sources
 * (image.c).  Internal; the public face is pl_image_probe / pl_image_decode
 * and the webdataset source in polyload.h.
 */
#ifndef POLYLOAD_IMAGE_H
#define POLYLOAD_IMAGE_H

#include "config/config.h"

enum { PL__IMG_JPEG = 1, PL__IMG_PNG = 2, PL__IMG_WEBP = 3 };

/* The format of a file name's extension (jpg, jpeg, png, webp; any case),
 * or 0. */
int pl__image_ext_format(const char *ext, size_t n);

/*
 * Width and height from the header of an image of `format` in data[0, len)
 * (len may be a prefix of the file: PL_ETRUNC when the header needs more).
 * No pixel is decoded.  PL_OK, PL_ETRUNC, or PL_EIMAGE with a message saying
 * what is wrong at which byte offset.
 */
int pl__image_probe(int format, const uint8_t *data, size_t len, uint32_t *w,
                    uint32_t *h, char *err, size_t errcap);

/* Qwen2-VL's smart_resize (transformers' image_processing_qwen2_vl.py):
 * both sides multiples of factor, area within [min_pixels, max_pixels],
 * aspect ratio kept as closely as possible.  PL_EIMAGE when the aspect
 * ratio exceeds 200 (as the reference raises). */
int pl__smart_resize(int64_t h, int64_t w, int64_t factor, int64_t min_pixels,
                     int64_t max_pixels, int64_t *rh, int64_t *rw, char *err,
                     size_t errcap);

/*
 * Decode the image in data[0, len) to RGB8 and resize it to exactly
 * out_w x out_h (bicubic) into out, as CHW planes (R, G, B; out_w*out_h*3
 * bytes, the caller's).  crop 0: the whole image is resized (aspect not
 * kept); crop 1: the shorter side is resized to fit and the centre is
 * cropped (CLIP / LLaVA preprocessing).  JPEGs are decoded at the DCT scale
 * M/8 closest above the target (libjpeg-turbo), so large photos are never
 * decoded at full size.  *tmp is a scratch buffer for the decoded image,
 * grown with realloc (*tmpcap its capacity; the caller frees it).
 * max_pixels: images whose header says more pixels are refused (PL_EIMAGE)
 * before any allocation.
 */
int pl__image_decode_resize(int format, const uint8_t *data, size_t len,
                            int64_t out_w, int64_t out_h, int crop,
                            int64_t max_pixels, uint8_t *out, uint8_t **tmp,
                            size_t *tmpcap, char *err, size_t errcap);

/* Per-thread scratch of the decode path: the compressed bytes, the decoded
 * image and the resized one (grown with realloc, kept between calls so a
 * worker does not fault in fresh pages per image), and the thread's cached
 * swscale context.  Freed when the thread exits (pthread key destructor).
 * NULL when out of memory. */
typedef struct pl__imgtls {
    uint8_t *data, *rgb, *tmp;
    size_t datacap, rgbcap, tmpcap;
    void *sws;
} pl__imgtls;
pl__imgtls *pl__image_tls(void);

/* RGB8 HWC (h x w) to CHW planes. */
void pl__image_hwc_to_chw(const uint8_t *hwc, int64_t h, int64_t w,
                          uint8_t *chw);
/* RGB8 CHW planes (h x w, multiples of patch*merge) to Qwen2-VL patches
 * [(h/p)*(w/p), 3*p*p]: patches ordered by merge block (row-major over
 * (h/p/m, w/p/m)), then row-major within the m x m block; each patch is
 * [channel, y, x]. */
void pl__image_patchify(const uint8_t *chw, int64_t h, int64_t w, int64_t p,
                        int64_t m, uint8_t *out);

#endif
