/*
 * image.c -- what an image-text source does with an image: read its size
 * from the header, decode it, resize it, lay it out for the batch.
 *
 * Headers: JPEG by walking its marker segments up to the first SOFn frame
 * header (ITU-T T.81 B.2); PNG from IHDR (the first chunk, PNG spec 11.2.2);
 * WebP through libwebp's WebPGetInfo, which reads only the RIFF header and
 * the VP8/VP8L/VP8X frame header.  Nothing is decoded, so the planner knows
 * every sample's visual-token count from the index alone.
 *
 * Decoding: libjpeg-turbo (with DCT-domain scaling: the image is decoded at
 * scale M/8, the smallest M in 1..8 whose output still covers the target,
 * so a 4000x3000 photo headed for 336x336 is decoded at 1/8), libspng
 * (any PNG colour type and bit depth to RGB8), libwebp.  Resizing: libswscale
 * (bicubic, SIMD); stb_image_resize (Mitchell filter, scalar float) is kept
 * as the measured alternative
 * (docs/internals/decisions/0004-libswscale-resizes-images.md), picked with
 * pl__image_resizer.  Each call allocates nothing but the caller's two
 * growable buffers and the codecs' own state.
 */
#include "source/image.h"

#include <stdio.h> /* before jpeglib.h, which needs FILE */

#include <pthread.h>

#include <jpeglib.h>
#include <libswscale/swscale.h>
#include <math.h>
#include <setjmp.h>
#include <spng.h>
#include <stdlib.h>
#include <string.h>
#include <webp/decode.h>

#define STBIR_ASSERT(x) ((void)0)
#include <stb_image_resize.h>

/* 0: libswscale (default), 1: stb_image_resize (the bench switches). */
int pl__image_resizer = 0;

int pl__image_ext_format(const char *ext, size_t n) {
    char e[8];
    if (n == 0 || n >= sizeof e) return 0;
    for (size_t i = 0; i < n; i++)
        e[i] = (char)(ext[i] >= 'A' && ext[i] <= 'Z' ? ext[i] + 32 : ext[i]);
    e[n] = '\0';
    if (!strcmp(e, "jpg") || !strcmp(e, "jpeg")) return PL__IMG_JPEG;
    if (!strcmp(e, "png")) return PL__IMG_PNG;
    if (!strcmp(e, "webp")) return PL__IMG_WEBP;
    return 0;
}

/* ------------------------------------------------------------ headers */

static int jpeg_probe(const uint8_t *d, size_t n, uint32_t *w, uint32_t *h,
                          char *err, size_t errcap) {
    if (n < 2) return PL_ETRUNC;
    if (d[0] != 0xFF || d[1] != 0xD8) {
        pl__fmt(err, errcap, "not a JPEG: no SOI marker at offset 0");
        return PL_EIMAGE;
    }
    size_t at = 2;
    for (;;) {
        /* Fill bytes (0xFF) may precede a marker. */
        while (at < n && d[at] == 0xFF && at + 1 < n && d[at + 1] == 0xFF) at++;
        if (at + 4 > n) return PL_ETRUNC;
        if (d[at] != 0xFF) {
            pl__fmt(err, errcap, "JPEG: expected a marker at offset %zu, found 0x%02x",
                    at, d[at]);
            return PL_EIMAGE;
        }
        uint8_t m = d[at + 1];
        if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
            at += 2; /* markers without a length */
            continue;
        }
        if (m == 0xD9 || m == 0xDA) {
            pl__fmt(err, errcap, "JPEG: %s at offset %zu before any frame header",
                    m == 0xD9 ? "end of image" : "start of scan", at);
            return PL_EIMAGE;
        }
        size_t seg = (size_t)d[at + 2] << 8 | d[at + 3];
        if (seg < 2) {
            pl__fmt(err, errcap, "JPEG: segment 0x%02x at offset %zu has length %zu",
                    m, at, seg);
            return PL_EIMAGE;
        }
        int sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
        if (sof) {
            if (at + 9 > n) return PL_ETRUNC;
            if (seg < 8) {
                pl__fmt(err, errcap, "JPEG: frame header at offset %zu is %zu bytes",
                        at, seg);
                return PL_EIMAGE;
            }
            *h = (uint32_t)d[at + 5] << 8 | d[at + 6];
            *w = (uint32_t)d[at + 7] << 8 | d[at + 8];
            if (*w == 0 || *h == 0) {
                pl__fmt(err, errcap,
                        "JPEG: frame header at offset %zu gives size %ux%u", at, *w,
                        *h);
                return PL_EIMAGE;
            }
            return PL_OK;
        }
        at += 2 + seg;
    }
}

static int png_probe(const uint8_t *d, size_t n, uint32_t *w, uint32_t *h,
                         char *err, size_t errcap) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (n < 8) return PL_ETRUNC;
    if (memcmp(d, sig, 8)) {
        pl__fmt(err, errcap, "not a PNG: bad signature at offset 0");
        return PL_EIMAGE;
    }
    if (n < 24) return PL_ETRUNC;
    if (memcmp(d + 12, "IHDR", 4)) {
        pl__fmt(err, errcap, "PNG: first chunk at offset 8 is not IHDR");
        return PL_EIMAGE;
    }
    *w = (uint32_t)d[16] << 24 | (uint32_t)d[17] << 16 | (uint32_t)d[18] << 8 | d[19];
    *h = (uint32_t)d[20] << 24 | (uint32_t)d[21] << 16 | (uint32_t)d[22] << 8 | d[23];
    if (*w == 0 || *h == 0 || *w > 0x7fffffffu || *h > 0x7fffffffu) {
        pl__fmt(err, errcap, "PNG: IHDR at offset 8 gives size %ux%u", *w, *h);
        return PL_EIMAGE;
    }
    return PL_OK;
}

static int webp_probe(const uint8_t *d, size_t n, uint32_t *w, uint32_t *h,
                          char *err, size_t errcap) {
    if (n < 30) return PL_ETRUNC;
    if (memcmp(d, "RIFF", 4) || memcmp(d + 8, "WEBP", 4)) {
        pl__fmt(err, errcap, "not a WebP: no RIFF/WEBP header at offset 0");
        return PL_EIMAGE;
    }
    int iw = 0, ih = 0;
    if (!WebPGetInfo(d, n, &iw, &ih) || iw <= 0 || ih <= 0) {
        pl__fmt(err, errcap, "WebP: bad frame header (at offset 12)");
        return PL_EIMAGE;
    }
    *w = (uint32_t)iw;
    *h = (uint32_t)ih;
    return PL_OK;
}

int pl__image_probe(int format, const uint8_t *data, size_t len, uint32_t *w,
                    uint32_t *h, char *err, size_t errcap) {
    switch (format) {
    case PL__IMG_JPEG: return jpeg_probe(data, len, w, h, err, errcap);
    case PL__IMG_PNG: return png_probe(data, len, w, h, err, errcap);
    case PL__IMG_WEBP: return webp_probe(data, len, w, h, err, errcap);
    default:
        pl__fmt(err, errcap, "unknown image format %d", format);
        return PL_EINVAL;
    }
}

int pl__smart_resize(int64_t h, int64_t w, int64_t factor, int64_t min_pixels,
                     int64_t max_pixels, int64_t *rh, int64_t *rw, char *err,
                     size_t errcap) {
    if (h <= 0 || w <= 0 || factor <= 0) {
        pl__fmt(err, errcap, "smart_resize: size %lldx%lld, factor %lld",
                (long long)w, (long long)h, (long long)factor);
        return PL_EINVAL;
    }
    double H = (double)h, W = (double)w, F = (double)factor;
    if ((H > W ? H / W : W / H) > 200) {
        pl__fmt(err, errcap,
                "image of %lldx%lld: aspect ratio above 200 (Qwen2-VL's limit)",
                (long long)w, (long long)h);
        return PL_EIMAGE;
    }
    /* Python's round() is round-half-to-even, as nearbyint by default. */
    int64_t hb = (int64_t)nearbyint(H / F) * factor;
    int64_t wb = (int64_t)nearbyint(W / F) * factor;
    if ((double)hb * (double)wb > (double)max_pixels) {
        double beta = sqrt(H * W / (double)max_pixels);
        hb = (int64_t)floor(H / beta / F) * factor;
        wb = (int64_t)floor(W / beta / F) * factor;
        if (hb < factor) hb = factor;
        if (wb < factor) wb = factor;
    } else if ((double)hb * (double)wb < (double)min_pixels) {
        double beta = sqrt((double)min_pixels / (H * W));
        hb = (int64_t)ceil(H * beta / F) * factor;
        wb = (int64_t)ceil(W * beta / F) * factor;
    }
    *rh = hb;
    *rw = wb;
    return PL_OK;
}

/* ------------------------------------------------------------ buffers */

static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static int tls_ok;

static void tls_free(void *p) {
    pl__imgtls *t = p;
    if (!t) return;
    free(t->data);
    free(t->rgb);
    free(t->tmp);
    sws_freeContext(t->sws);
    free(t);
}

static void tls_init(void) {
    tls_ok = pthread_key_create(&tls_key, tls_free) == 0;
}

pl__imgtls *pl__image_tls(void) {
    pthread_once(&tls_once, tls_init);
    if (!tls_ok) return NULL;
    pl__imgtls *t = pthread_getspecific(tls_key);
    if (t) return t;
    t = pl__calloc(1, sizeof *t);
    if (t && pthread_setspecific(tls_key, t) != 0) {
        free(t);
        t = NULL;
    }
    return t;
}

/* Decoded images are read by libswscale's SIMD input code, which may read a
 * little past the last pixel (FFmpeg pads its buffers by
 * AV_INPUT_BUFFER_PADDING_SIZE, 64): every decode buffer gets this much more
 * (found by tests/fuzz/fuzz_image.c on a 1-pixel-wide image). */
#define PL__SWS_PAD 256

static int grow(uint8_t **buf, size_t *cap, size_t need) {
    need += PL__SWS_PAD;
    if (need <= *cap) return PL_OK;
    uint8_t *nb = pl__realloc_array(*buf, need, 1);
    if (!nb) return PL_ENOMEM;
    *buf = nb;
    *cap = need;
    return PL_OK;
}

/* ------------------------------------------------------------ decoders */

typedef struct pl__jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    int warned;
} pl__jerr;

static void jpeg_error_exit(j_common_ptr c) {
    pl__jerr *e = (pl__jerr *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

/* Corrupt data libjpeg can recover from (it pads a truncated scan with
 * grey) is an error for us: a training image must be whole. */
static void jpeg_emit(j_common_ptr c, int level) {
    pl__jerr *e = (pl__jerr *)c->err;
    if (level < 0 && !e->warned) {
        c->err->format_message(c, e->msg);
        e->warned = 1;
    }
}

/* Decode at the DCT scale M/8 closest above (need_w, need_h). */
static int jpeg_decode(const uint8_t *data, size_t len, int64_t need_w,
                           int64_t need_h, int64_t max_pixels, uint8_t **rgb,
                           size_t *cap, int64_t *ow, int64_t *oh, char *err,
                           size_t errcap) {
    struct jpeg_decompress_struct cinfo;
    pl__jerr jerr;
    memset(&jerr, 0, sizeof jerr);
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = jpeg_error_exit;
    jerr.pub.emit_message = jpeg_emit;
    volatile int rc = PL_OK;
    if (setjmp(jerr.jb)) {
        pl__fmt(err, errcap, "JPEG: %s", jerr.msg);
        jpeg_destroy_decompress(&cinfo);
        return rc ? rc : PL_EIMAGE;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    if ((int64_t)cinfo.image_width * cinfo.image_height > max_pixels) {
        pl__fmt(err, errcap, "JPEG: %ux%u pixels exceed the limit of %lld",
                cinfo.image_width, cinfo.image_height, (long long)max_pixels);
        jpeg_destroy_decompress(&cinfo);
        return PL_EIMAGE;
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_denom = 8;
    cinfo.scale_num = 8;
    for (unsigned m = 1; m <= 8; m++) {
        /* jpeg_calc_output_dimensions rounds up: ceil(dim * m / 8). */
        int64_t sw = ((int64_t)cinfo.image_width * m + 7) / 8;
        int64_t sh = ((int64_t)cinfo.image_height * m + 7) / 8;
        if (sw >= need_w && sh >= need_h) {
            cinfo.scale_num = m;
            break;
        }
    }
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    int64_t w = cinfo.output_width, h = cinfo.output_height;
    size_t stride = (size_t)w * 3;
    if (grow(rgb, cap, stride * (size_t)h)) {
        rc = PL_ENOMEM;
        pl__fmt(jerr.msg, sizeof jerr.msg, "out of memory");
        longjmp(jerr.jb, 1);
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = *rgb + stride * cinfo.output_scanline;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (jerr.warned) {
        pl__fmt(err, errcap, "JPEG: corrupt data: %s", jerr.msg);
        return PL_EIMAGE;
    }
    *ow = w;
    *oh = h;
    return PL_OK;
}

static int png_decode(const uint8_t *data, size_t len, int64_t max_pixels,
                          uint8_t **rgb, size_t *cap, int64_t *ow, int64_t *oh,
                          char *err, size_t errcap) {
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) {
        pl__fmt(err, errcap, "PNG: out of memory");
        return PL_ENOMEM;
    }
    int rc = PL_OK, e;
    struct spng_ihdr ihdr;
    size_t need = 0;
    spng_set_crc_action(ctx, SPNG_CRC_ERROR, SPNG_CRC_ERROR);
    spng_set_chunk_limits(ctx, (size_t)1 << 26, (size_t)1 << 26);
    if ((e = spng_set_png_buffer(ctx, data, len)) || (e = spng_get_ihdr(ctx, &ihdr))) {
        rc = PL_EIMAGE;
        goto fail;
    }
    if ((int64_t)ihdr.width * ihdr.height > max_pixels) {
        pl__fmt(err, errcap, "PNG: %ux%u pixels exceed the limit of %lld", ihdr.width,
                ihdr.height, (long long)max_pixels);
        spng_ctx_free(ctx);
        return PL_EIMAGE;
    }
    if ((e = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &need))) {
        rc = PL_EIMAGE;
        goto fail;
    }
    if (grow(rgb, cap, need)) {
        spng_ctx_free(ctx);
        pl__fmt(err, errcap, "PNG: out of memory for %zu bytes", need);
        return PL_ENOMEM;
    }
    if ((e = spng_decode_image(ctx, *rgb, need, SPNG_FMT_RGB8, 0))) {
        rc = PL_EIMAGE;
        goto fail;
    }
    spng_ctx_free(ctx);
    *ow = ihdr.width;
    *oh = ihdr.height;
    return PL_OK;
fail:
    pl__fmt(err, errcap, "PNG: %s", spng_strerror(e));
    spng_ctx_free(ctx);
    return rc;
}

static int webp_decode(const uint8_t *data, size_t len, int64_t max_pixels,
                           uint8_t **rgb, size_t *cap, int64_t *ow, int64_t *oh,
                           char *err, size_t errcap) {
    int w = 0, h = 0;
    if (!WebPGetInfo(data, len, &w, &h) || w <= 0 || h <= 0) {
        pl__fmt(err, errcap, "WebP: bad header");
        return PL_EIMAGE;
    }
    if ((int64_t)w * h > max_pixels) {
        pl__fmt(err, errcap, "WebP: %dx%d pixels exceed the limit of %lld", w, h,
                (long long)max_pixels);
        return PL_EIMAGE;
    }
    size_t need = (size_t)w * (size_t)h * 3;
    if (grow(rgb, cap, need)) {
        pl__fmt(err, errcap, "WebP: out of memory for %zu bytes", need);
        return PL_ENOMEM;
    }
    if (!WebPDecodeRGBInto(data, len, *rgb, need, w * 3)) {
        pl__fmt(err, errcap, "WebP: corrupt or truncated bitstream");
        return PL_EIMAGE;
    }
    *ow = w;
    *oh = h;
    return PL_OK;
}

/* ------------------------------------------------------------ resize */

/* Resize the RGB8 HWC region (sx, sy, sw, sh) of src (stride sstride) to
 * dw x dh CHW planes at dst.  libswscale converts packed RGB24 to planar
 * GBRP while it scales, about 3x faster than scaling to RGB24 (its packed
 * output path has no SIMD), and planar is the layout the batch wants. */
static int s_resize(const uint8_t *src, int64_t sstride, int64_t sx, int64_t sy,
                      int64_t sw, int64_t sh, uint8_t *dst, int64_t dw, int64_t dh,
                      char *err, size_t errcap) {
    const uint8_t *s0 = src + sy * sstride + sx * 3;
    const int64_t n = dw * dh;
    if (sw == dw && sh == dh) {
        for (int64_t y = 0; y < dh; y++)
            for (int64_t x = 0; x < dw; x++) {
                const uint8_t *p = s0 + y * sstride + 3 * x;
                dst[y * dw + x] = p[0];
                dst[n + y * dw + x] = p[1];
                dst[2 * n + y * dw + x] = p[2];
            }
        return PL_OK;
    }
    if (pl__image_resizer == 1) {
        uint8_t *hwc = pl__malloc((size_t)n * 3);
        if (!hwc || !stbir_resize_uint8(s0, (int)sw, (int)sh, (int)sstride, hwc, (int)dw,
                                        (int)dh, (int)(dw * 3), 3)) {
            free(hwc);
            pl__fmt(err, errcap, "resize %lldx%lld -> %lldx%lld failed", (long long)sw,
                    (long long)sh, (long long)dw, (long long)dh);
            return PL_ENOMEM;
        }
        pl__image_hwc_to_chw(hwc, dh, dw, dst);
        free(hwc);
        return PL_OK;
    }
    /* The thread's context is reused when the sizes repeat; sws_getCachedContext
     * rebuilds it otherwise. */
    pl__imgtls *t = pl__image_tls();
    struct SwsContext *c = sws_getCachedContext(
        t ? t->sws : NULL, (int)sw, (int)sh, AV_PIX_FMT_RGB24, (int)dw, (int)dh,
        AV_PIX_FMT_GBRP, SWS_BICUBIC, NULL, NULL, NULL);
    if (t) t->sws = c;
    if (!c) {
        pl__fmt(err, errcap, "resize %lldx%lld -> %lldx%lld: no swscale context",
                (long long)sw, (long long)sh, (long long)dw, (long long)dh);
        return PL_ENOMEM;
    }
    const uint8_t *sp[4] = {s0, NULL, NULL, NULL};
    int ss[4] = {(int)sstride, 0, 0, 0};
    uint8_t *dp[4] = {dst + n, dst + 2 * n, dst, NULL}; /* GBRP: G, B, R planes */
    int ds[4] = {(int)dw, (int)dw, (int)dw, 0};
    sws_scale(c, sp, ss, 0, (int)sh, dp, ds);
    if (!t) sws_freeContext(c);
    return PL_OK;
}

int pl__image_decode_resize(int format, const uint8_t *data, size_t len,
                            int64_t out_w, int64_t out_h, int crop,
                            int64_t max_pixels, uint8_t *out, uint8_t **tmp,
                            size_t *tmpcap, char *err, size_t errcap) {
    if (out_w <= 0 || out_h <= 0 || out_w > 65535 || out_h > 65535) {
        pl__fmt(err, errcap, "target size %lldx%lld is out of range",
                (long long)out_w, (long long)out_h);
        return PL_EINVAL;
    }
    uint32_t hw = 0, hh = 0;
    int rc = pl__image_probe(format, data, len, &hw, &hh, err, errcap);
    if (rc == PL_ETRUNC) {
        pl__fmt(err, errcap, "image header truncated (%zu bytes)", len);
        return PL_EIMAGE;
    }
    if (rc) return rc;
    if ((int64_t)hw * hh > max_pixels) {
        pl__fmt(err, errcap, "image of %ux%u pixels exceeds the limit of %lld", hw, hh,
                (long long)max_pixels);
        return PL_EIMAGE;
    }
    /* What the decoder must at least deliver for the target. */
    int64_t need_w = out_w, need_h = out_h;
    if (crop) {
        /* Shorter side to the target's: scale = max(out_w / w, out_h / h). */
        double s = fmax((double)out_w / hw, (double)out_h / hh);
        need_w = (int64_t)ceil(hw * s);
        need_h = (int64_t)ceil(hh * s);
    }
    int64_t w = 0, h = 0;
    if (format == PL__IMG_JPEG)
        rc = jpeg_decode(data, len, need_w, need_h, max_pixels, tmp, tmpcap, &w, &h,
                             err, errcap);
    else if (format == PL__IMG_PNG)
        rc = png_decode(data, len, max_pixels, tmp, tmpcap, &w, &h, err, errcap);
    else
        rc = webp_decode(data, len, max_pixels, tmp, tmpcap, &w, &h, err, errcap);
    if (rc) return rc;
    int64_t sx = 0, sy = 0, sw = w, sh = h;
    if (crop) {
        /* The centre region of the decoded image with the target's aspect. */
        if (w * out_h > h * out_w) {
            sw = (h * out_w + out_h / 2) / out_h;
            if (sw < 1) sw = 1;
            sx = (w - sw) / 2;
        } else {
            sh = (w * out_h + out_w / 2) / out_w;
            if (sh < 1) sh = 1;
            sy = (h - sh) / 2;
        }
    }
    return s_resize(*tmp, w * 3, sx, sy, sw, sh, out, out_w, out_h, err, errcap);
}

void pl__image_hwc_to_chw(const uint8_t *hwc, int64_t h, int64_t w,
                          uint8_t *chw) {
    const int64_t n = h * w;
    for (int64_t i = 0; i < n; i++) {
        chw[i] = hwc[3 * i];
        chw[n + i] = hwc[3 * i + 1];
        chw[2 * n + i] = hwc[3 * i + 2];
    }
}

void pl__image_patchify(const uint8_t *chw, int64_t h, int64_t w, int64_t p,
                        int64_t m, uint8_t *out) {
    const int64_t gh = h / p, gw = w / p, pd = 3 * p * p, n = h * w;
    int64_t k = 0;
    for (int64_t by = 0; by < gh / m; by++)
        for (int64_t bx = 0; bx < gw / m; bx++)
            for (int64_t my = 0; my < m; my++)
                for (int64_t mx = 0; mx < m; mx++, k++) {
                    uint8_t *o = out + k * pd;
                    const int64_t y0 = (by * m + my) * p, x0 = (bx * m + mx) * p;
                    for (int64_t c = 0; c < 3; c++)
                        for (int64_t y = 0; y < p; y++, o += p)
                            memcpy(o, chw + c * n + (y0 + y) * w + x0, (size_t)p);
                }
}
