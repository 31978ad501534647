/*
 * package.c -- what a data constructor ships to the trainer ranks of one DP
 * rank for one step: compact (tokens at their stored width plus the plan of
 * the rank's sequences), expanded into SPEC section 3 fields by the
 * receiving loader (pl_loader_push_package).
 *
 * Layout (little-endian):
 *   "PLPK", u32 version, u64 total length,
 *   i64 step, i64 dp_rank, i64 n_reads, u64 state length, u64 plan length,
 *   i64 n_images,
 *   the state blob (PLST) of the step's start,
 *   the plan restricted to dp_rank (PLPN: every sequence of other ranks is
 *     empty; rank_cost and lower_bound are the whole step's),
 *   n_reads x { i32 dtype, i32 0, i64 count } in pl_plan_step_reads order,
 *   the tokens of every read back to back at the width of its dtype,
 *   n_images x { i64 read, i64 tokens, i64 height, i64 width, i32 status,
 *     i32 0, u64 bytes } (pl_payload_image, reads increasing), then the
 *     images' data back to back,
 *   the whole step's loss tokens by source (version 3): ns x { i64 chunks,
 *     i64 tokens but each document's last } for config source indexes
 *     0..ns-1, then u64 ns (the receiving loader's step_loss_tokens: the
 *     plan above holds only this DP rank's chunks),
 *   u64 XXH3-64 of everything before it.
 * Tokens are not aligned; readers convert with unaligned loads.
 */
#include "wire/wire.h"

#include <stdlib.h>
#include <string.h>

#define PL__PACKAGE_VERSION 3u
#define PL__PACKAGE_HEADER (4 + 4 + 8 + 6 * 8)
#define PL__PACKAGE_IMAGE 48

int pl_plan_step_reads(const pl_plan *plan, int64_t dp_rank, pl_read *out,
                       int64_t cap, int64_t *n) {
    if (!plan || !n || dp_rank < 0 || dp_rank >= plan->dp) return PL_ERANGE;
    int64_t total = 0;
    for (int64_t mb = 0; mb < plan->micro_batches_per_rank; mb++) {
        int64_t k = 0;
        int64_t room = out && total < cap ? cap - total : 0;
        int rc = pl_plan_reads(plan, dp_rank, mb, room ? out + total : NULL, room, &k);
        if (rc && rc != PL_EINVAL) return rc;
        total += k;
    }
    *n = total;
    return out && total > cap ? PL_EINVAL : PL_OK;
}

/* The plan with only dp_rank's sequences' chunks. */
static int plan_subset(const pl_plan *p, int64_t dp_rank, pl_plan **out) {
    *out = NULL;
    size_t n = (size_t)p->n_sequences;
    pl__plan_impl *m = pl__calloc(1, sizeof *m);
    if (!m) return PL_ENOMEM;
    int64_t per = p->micro_batches_per_rank * p->micro_batch_size;
    const int64_t *mine = p->rank_sequences + dp_rank * per;
    int64_t nch = 0;
    for (int64_t j = 0; j < per; j++)
        nch += p->seq_offsets[mine[j] + 1] - p->seq_offsets[mine[j]];
    m->chunks = pl__calloc(nch ? (size_t)nch : 1, sizeof(pl_chunk));
    m->seq_offsets = pl__calloc(n + 1, 8);
    m->seq_tokens = pl__calloc(n, 8);
    m->seq_cost = pl__calloc(n, 8);
    m->rank_sequences = pl__calloc(n, 8);
    m->rank_cost = pl__calloc((size_t)p->dp, 8);
    char *is_mine = pl__calloc(n, 1);
    if (!m->chunks || !m->seq_offsets || !m->seq_tokens || !m->seq_cost ||
        !m->rank_sequences || !m->rank_cost || !is_mine) {
        free(is_mine);
        pl_plan_free(&m->pub);
        return PL_ENOMEM;
    }
    for (int64_t j = 0; j < per; j++) is_mine[mine[j]] = 1;
    int64_t w = 0, tokens = 0;
    for (size_t q = 0; q < n; q++) {
        m->seq_offsets[q] = w;
        if (!is_mine[q]) continue;
        for (int64_t j = p->seq_offsets[q]; j < p->seq_offsets[q + 1]; j++) {
            m->chunks[w++] = p->chunks[j];
            tokens += p->chunks[j].length;
        }
        m->seq_tokens[q] = p->seq_tokens[q];
        m->seq_cost[q] = p->seq_cost[q];
    }
    m->seq_offsets[n] = w;
    free(is_mine);
    memcpy(m->rank_sequences, p->rank_sequences, n * 8);
    memcpy(m->rank_cost, p->rank_cost, (size_t)p->dp * 8);
    m->pub = *p;
    m->pub.n_chunks = w;
    m->pub.tokens = tokens;
    m->pub.chunks = m->chunks;
    m->pub.seq_offsets = m->seq_offsets;
    m->pub.seq_tokens = m->seq_tokens;
    m->pub.seq_cost = m->seq_cost;
    m->pub.rank_sequences = m->rank_sequences;
    m->pub.rank_cost = m->rank_cost;
    *out = &m->pub;
    return PL_OK;
}

static int token_dtype_ok(int32_t dt) {
    return dt >= PL_DTYPE_UINT8 && dt <= PL_DTYPE_UINT32;
}

int pl_package_encode(const pl_plan *plan, int64_t dp_rank, const void *state,
                      size_t state_len, const pl_payload *payloads,
                      int64_t n_payloads, void *buf, size_t cap, size_t *len) {
    return pl_package_encode_v2(plan, dp_rank, state, state_len, payloads, n_payloads,
                                NULL, 0, buf, cap, len);
}

int pl_package_encode_v2(const pl_plan *plan, int64_t dp_rank, const void *state,
                         size_t state_len, const pl_payload *payloads,
                         int64_t n_payloads, const pl_payload_image *images,
                         int64_t n_images, void *buf, size_t cap, size_t *len) {
    if (!plan || !len || (!state && state_len) || n_payloads < 0 ||
        (n_payloads > 0 && !payloads) || n_images < 0 || (n_images > 0 && !images))
        return PL_EINVAL;
    size_t image_bytes = 0;
    for (int64_t k = 0; k < n_images; k++) {
        const pl_payload_image *im = &images[k];
        if (im->read < 0 || im->read >= n_payloads || (k && im->read <= images[k - 1].read) ||
            (im->bytes && !im->data) || im->status > 0 ||
            (im->reserved != 0 && im->reserved != PL_IMAGE_BLANK))
            return PL_EINVAL;
        image_bytes += PL__PACKAGE_IMAGE + im->bytes;
    }
    if (dp_rank < 0 || dp_rank >= plan->dp) return PL_ERANGE;
    int64_t n_reads = 0;
    int rc = pl_plan_step_reads(plan, dp_rank, NULL, 0, &n_reads);
    if (rc) return rc;
    if (n_reads != n_payloads) return PL_EINVAL;
    pl_read *reads = pl__calloc(n_reads ? (size_t)n_reads : 1, sizeof *reads);
    if (!reads) return PL_ENOMEM;
    rc = pl_plan_step_reads(plan, dp_rank, reads, n_reads, &n_reads);
    size_t token_bytes = 0;
    for (int64_t i = 0; !rc && i < n_reads; i++) {
        if (!token_dtype_ok(payloads[i].dtype) || payloads[i].count < reads[i].count ||
            (!payloads[i].data && reads[i].count > 0))
            rc = PL_EINVAL;
        else
            token_bytes += (size_t)reads[i].count * pl_dtype_size(payloads[i].dtype);
    }
    pl_plan *sub = NULL;
    size_t plan_len = 0;
    if (!rc) rc = plan_subset(plan, dp_rank, &sub);
    if (!rc) rc = pl_plan_encode(sub, NULL, 0, &plan_len);
    /* The whole step's loss tokens by source. */
    int64_t ns = 0;
    for (int64_t j = 0; j < plan->n_chunks; j++)
        if (plan->chunks[j].source >= ns) ns = (int64_t)plan->chunks[j].source + 1;
    int64_t *loss = pl__calloc((size_t)(2 * ns + 1), sizeof *loss);
    if (!rc && !loss) rc = PL_ENOMEM;
    for (int64_t j = 0; !rc && j < plan->n_chunks; j++) {
        const pl_chunk *c = &plan->chunks[j];
        if (c->source < 0) continue;
        loss[2 * c->source]++;
        loss[2 * c->source + 1] += c->length - ((c->flags & PL_CHUNK_DOC_END) != 0);
    }
    size_t total = PL__PACKAGE_HEADER + state_len + plan_len +
                   (size_t)n_reads * 16 + token_bytes + image_bytes + 16 * (size_t)ns + 8 + 8;
    if (!rc) *len = total;
    if (!rc && buf) {
        if (cap < total) {
            rc = PL_EINVAL;
        } else {
            unsigned char *b = buf, *w = b;
            uint32_t version = PL__PACKAGE_VERSION;
            uint64_t t64 = total, sl = state_len, plen = plan_len;
            int64_t hdr[3] = {plan->step, dp_rank, n_reads};
            memcpy(w, "PLPK", 4);
            memcpy(w + 4, &version, 4);
            memcpy(w + 8, &t64, 8);
            memcpy(w + 16, hdr, 24);
            memcpy(w + 40, &sl, 8);
            memcpy(w + 48, &plen, 8);
            memcpy(w + 56, &n_images, 8);
            w += PL__PACKAGE_HEADER;
            if (state_len) memcpy(w, state, state_len);
            w += state_len;
            rc = pl_plan_encode(sub, w, plan_len, &plan_len);
            w += plan_len;
            for (int64_t i = 0; i < n_reads; i++) {
                int32_t d[2] = {payloads[i].dtype, 0};
                memcpy(w, d, 8);
                memcpy(w + 8, &reads[i].count, 8);
                w += 16;
            }
            for (int64_t i = 0; i < n_reads; i++) {
                size_t nb = (size_t)reads[i].count * pl_dtype_size(payloads[i].dtype);
                if (nb) memcpy(w, payloads[i].data, nb);
                w += nb;
            }
            for (int64_t k = 0; k < n_images; k++) {
                const pl_payload_image *im = &images[k];
                int64_t rec[4] = {im->read, im->tokens, im->height, im->width};
                int32_t st[2] = {im->status, im->reserved};
                uint64_t nb = im->bytes;
                memcpy(w, rec, 32);
                memcpy(w + 32, st, 8);
                memcpy(w + 40, &nb, 8);
                w += PL__PACKAGE_IMAGE;
            }
            for (int64_t k = 0; k < n_images; k++) {
                if (images[k].bytes) memcpy(w, images[k].data, images[k].bytes);
                w += images[k].bytes;
            }
            uint64_t uns = (uint64_t)ns;
            if (ns) memcpy(w, loss, 16 * (size_t)ns);
            w += 16 * (size_t)ns;
            memcpy(w, &uns, 8);
            w += 8;
            uint64_t h = pl__hash64(b, (size_t)(w - b), 0);
            memcpy(w, &h, 8);
        }
    }
    pl_plan_free(sub);
    free(reads);
    free(loss);
    return rc;
}

/* Envelope check; fills the header fields. */
static int package_open(const void *buf, size_t len, int64_t hdr[4],
                            uint64_t *state_len, uint64_t *plan_len) {
    const unsigned char *b = buf;
    if (!b || len < PL__PACKAGE_HEADER + 8 || memcmp(b, "PLPK", 4) != 0)
        return PL_EINVAL;
    uint32_t version;
    uint64_t total, h;
    memcpy(&version, b + 4, 4);
    memcpy(&total, b + 8, 8);
    if (version != PL__PACKAGE_VERSION) return PL_EVERSION;
    if (total != len) return PL_EINVAL;
    memcpy(&h, b + len - 8, 8);
    if (h != pl__hash64(b, len - 8, 0)) return PL_EINVAL;
    memcpy(hdr, b + 16, 24);
    memcpy(state_len, b + 40, 8);
    memcpy(plan_len, b + 48, 8);
    memcpy(&hdr[3], b + 56, 8);
    if (len < PL__PACKAGE_HEADER + 16) return PL_EINVAL;
    uint64_t ns;
    memcpy(&ns, b + len - 16, 8);
    if (ns > (len - PL__PACKAGE_HEADER - 16) / 16) return PL_EINVAL;
    size_t room = len - PL__PACKAGE_HEADER - 16 - 16 * (size_t)ns;
    if (hdr[0] < 0 || hdr[1] < 0 || hdr[2] < 0 || hdr[3] < 0 || hdr[3] > hdr[2] ||
        *state_len > room ||
        *plan_len > room - *state_len ||
        (uint64_t)hdr[2] > (room - *state_len - *plan_len) / 16)
        return PL_EINVAL;
    return PL_OK;
}

int pl_package_inspect(const void *buf, size_t len, int64_t *step,
                       int64_t *dp_rank) {
    int64_t hdr[4];
    uint64_t sl, pl;
    int rc = package_open(buf, len, hdr, &sl, &pl);
    if (rc) return rc;
    if (step) *step = hdr[0];
    if (dp_rank) *dp_rank = hdr[1];
    return PL_OK;
}

void pl__package_free(pl__package *k) {
    if (!k) return;
    pl_plan_free(k->plan);
    free(k->reads);
    free(k->images);
    free(k->image_of);
    free(k->mb_first);
    free(k->buf);
    free(k);
}

int pl__package_decode(const void *buf, size_t len, pl__package **out,
                       char *err, size_t errcap) {
    *out = NULL;
    int64_t hdr[4];
    uint64_t sl, plen;
    int rc = package_open(buf, len, hdr, &sl, &plen);
    if (rc) {
        pl__fmt(err, errcap, "package: %zu bytes are not a valid package (%s)",
                len, rc == PL_EVERSION ? "unsupported version" : "corrupt");
        return PL_EINVAL;
    }
    pl__package *k = pl__calloc(1, sizeof *k);
    if (k) k->buf = pl__malloc(len ? len : 1);
    if (!k || !k->buf) {
        free(k);
        pl__fmt(err, errcap, "package of %zu bytes: out of memory", len);
        return PL_ENOMEM;
    }
    memcpy(k->buf, buf, len);
    const unsigned char *b = k->buf;
    k->step = hdr[0];
    k->dp_rank = hdr[1];
    k->n_reads = hdr[2];
    k->n_images = hdr[3];
    k->state = b + PL__PACKAGE_HEADER;
    k->state_len = (size_t)sl;
    rc = pl_plan_decode(b + PL__PACKAGE_HEADER + sl, (size_t)plen, &k->plan);
    if (rc) {
        pl__fmt(err, errcap, "package of step %lld: %s", (long long)k->step,
                rc == PL_ENOMEM ? "out of memory decoding its plan" : "its plan is corrupt");
        pl__package_free(k);
        return rc == PL_ENOMEM ? PL_ENOMEM : PL_EINVAL;
    }
    if (k->plan->step != k->step || k->dp_rank >= k->plan->dp) {
        pl__fmt(err, errcap, "package: step %lld / DP rank %lld disagree with its plan",
                (long long)k->step, (long long)k->dp_rank);
        pl__package_free(k);
        return PL_EINVAL;
    }
    /* Reads: the table must be the plan's reads, payloads inside the buffer. */
    int64_t nmb = k->plan->micro_batches_per_rank, want = 0;
    pl_read *reads = NULL;
    k->reads = pl__calloc(k->n_reads ? (size_t)k->n_reads : 1, sizeof *k->reads);
    k->mb_first = pl__calloc((size_t)nmb + 1, sizeof *k->mb_first);
    k->images = pl__calloc(k->n_images ? (size_t)k->n_images : 1, sizeof *k->images);
    k->image_of = pl__calloc(k->n_reads ? (size_t)k->n_reads : 1, sizeof *k->image_of);
    rc = !k->reads || !k->mb_first || !k->images || !k->image_of ? PL_ENOMEM
                                   : pl_plan_step_reads(k->plan, k->dp_rank, NULL, 0, &want);
    if (!rc && want != k->n_reads) rc = PL_EINVAL;
    if (!rc) {
        reads = pl__calloc(want ? (size_t)want : 1, sizeof *reads);
        rc = reads ? pl_plan_step_reads(k->plan, k->dp_rank, reads, want, &want)
                   : PL_ENOMEM;
    }
    for (int64_t mb = 0; !rc && mb < nmb; mb++) {
        int64_t n = 0;
        rc = pl_plan_reads(k->plan, k->dp_rank, mb, NULL, 0, &n);
        k->mb_first[mb + 1] = k->mb_first[mb] + n;
    }
    const unsigned char *tab = b + PL__PACKAGE_HEADER + sl + plen;
    const unsigned char *tok = tab + (size_t)k->n_reads * 16;
    uint64_t ns;
    memcpy(&ns, b + len - 16, 8); /* checked by pl__package_open */
    const unsigned char *end = b + len - 16 - 16 * (size_t)ns;
    k->n_step_loss = (int64_t)ns;
    k->step_loss = ns ? (const void *)end : NULL;
    for (int64_t i = 0; !rc && i < k->n_reads; i++) {
        int32_t d[2];
        int64_t count;
        memcpy(d, tab + 16 * i, 8);
        memcpy(&count, tab + 16 * i + 8, 8);
        size_t es = token_dtype_ok(d[0]) ? pl_dtype_size(d[0]) : 0;
        if (!es || count != reads[i].count || count < 0 ||
            (uint64_t)count > (uint64_t)(end - tok) / es) {
            rc = PL_EINVAL;
            break;
        }
        k->reads[i] = (pl_payload){tok, d[0], 0, count};
        k->image_of[i] = -1;
        tok += (size_t)count * es;
    }
    /* Images: records inside the buffer, reads increasing, data back to back. */
    if (!rc && (uint64_t)k->n_images > (uint64_t)(end - tok) / PL__PACKAGE_IMAGE) rc = PL_EINVAL;
    const unsigned char *itab = tok, *idata = tok + (size_t)k->n_images * PL__PACKAGE_IMAGE;
    for (int64_t j = 0; !rc && j < k->n_images; j++) {
        int64_t rec[4];
        int32_t st[2];
        uint64_t nb;
        memcpy(rec, itab + (size_t)j * PL__PACKAGE_IMAGE, 32);
        memcpy(st, itab + (size_t)j * PL__PACKAGE_IMAGE + 32, 8);
        memcpy(&nb, itab + (size_t)j * PL__PACKAGE_IMAGE + 40, 8);
        if (rec[0] < 0 || rec[0] >= k->n_reads || (j && rec[0] <= k->images[j - 1].read) ||
            rec[1] <= 0 || rec[2] <= 0 || rec[3] <= 0 || st[0] > 0 ||
            (st[1] != 0 && st[1] != PL_IMAGE_BLANK) ||
            nb > (uint64_t)(end - idata)) {
            rc = PL_EINVAL;
            break;
        }
        k->images[j] = (pl_payload_image){rec[0], rec[1], rec[2], rec[3], st[0], st[1],
                                          nb ? idata : NULL, (size_t)nb};
        k->image_of[rec[0]] = j;
        idata += nb;
    }
    if (!rc) tok = idata;
    if (!rc && tok != end) rc = PL_EINVAL;
    free(reads);
    if (rc) {
        if (rc == PL_EINVAL)
            pl__fmt(err, errcap,
                    "package of step %lld, DP rank %lld: its read table does not "
                    "match its plan",
                    (long long)k->step, (long long)k->dp_rank);
        else if (rc == PL_ENOMEM)
            pl__fmt(err, errcap, "package of step %lld: out of memory", (long long)k->step);
        pl__package_free(k);
        return rc;
    }
    *out = k;
    return PL_OK;
}
