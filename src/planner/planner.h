/*
 * planner/planner.h -- the planner's state, shared by planner.c (mixture,
 * chunking, step membership), pack.c (packing into sequences), balance.c
 * and window.c (arrangement by cost, within a step and over a window of
 * steps), cost.c, state.c (the state blob of SPEC section 4) and reads.c
 * (what a plan's micro-batch reads).
 */
#ifndef POLYLOAD_PLANNER_INTERNAL_H
#define POLYLOAD_PLANNER_INTERNAL_H

#include "source/source.h"

/* Mixture targets are exact: integers in units of 2^-PL__TBITS token, and
 * weights the same fixed point (planner.c, "The draw").  GCC and Clang's
 * 128-bit integer; every target and product of the draw fits (tokens below
 * 2^63 times weights of at most 2^48). */
__extension__ typedef __int128 pl__i128;
#define PL__TBITS 48
#define PL__WONE ((int64_t)1 << PL__TBITS) /* the weight 1 */

/* Consumption state of one source (SPEC section 4). */
typedef struct pl__src_state {
    int64_t epoch;
    int64_t drawn_in_epoch; /* documents taken from the permutation */
    int64_t cur_index;      /* document being chunked, -1 if none */
    int64_t cur_offset;     /* its tokens already drawn */
    int64_t cur_length;
    int64_t drawn_tokens;
    int64_t documents;      /* documents started, all epochs */
    int64_t since_yield;    /* documents taken without a usable one */
    int64_t skipped;        /* bad documents skipped (on_error: skip) */
    int64_t reserved_;      /* 0: no padding before target (memcmp) */
    pl__i128 target;        /* target tokens, in units of 2^-PL__TBITS */
} pl__src_state;

/* A source's target in tokens (for checks and statistics). */
static inline double pl__target_tokens(const pl__src_state *s) {
    return (double)s->target * 0x1p-48;
}

/* A growable array of chunks. */
typedef struct pl__chunks {
    pl_chunk *v;
    int64_t n, cap;
} pl__chunks;
int pl__chunks_push(pl__chunks *c, const pl_chunk *ch);
void pl__chunks_free(pl__chunks *c);

/* A class member in its class's heap: its drawn tokens (the key, kept
 * here so that sifting reads no source state) and its index. */
typedef struct pl__hent {
    int64_t d, i;
} pl__hent;

/* The kinetic tournament of the draw (planner.c): a node, and the line of
 * a class (its deficit after g tokens of the step is b + w * g). */
typedef struct pl__tnode {
    int64_t min;
    int32_t win, unused_;
} pl__tnode;
typedef struct pl__tline {
    pl__i128 b;
    int64_t w, key;
} pl__tline;

/* One source's next document, known ahead (planner.c). */
typedef struct pl__ahead {
    int64_t doc, at, epoch;
} pl__ahead;

struct pl_planner {
    char errmsg[PL__ERRMSG_CAP];
    pl_config *cfg;          /* owned clone */
    pl_source *const *sources; /* borrowed, [n_sources] */
    int64_t n_sources;
    int64_t *num_docs;       /* [n_sources] */
    int64_t step;            /* next step to plan */
    uint64_t mixture_hash;
    uint64_t arrangement_hash; /* pl__arrangement_hash of cfg */
    pl__src_state *src;      /* [n_sources] */
    pl__perm *perm;          /* [n_sources], for src[i].epoch */
    double *weights;         /* scratch [n_sources] */
    pl__chunks carry;        /* chunks carried into `step` */
    pl__chunks items;        /* scratch */
    int64_t max_chunk;       /* longest chunk, a multiple of 2*cp */
    int64_t align;           /* 2*cp when cp > 1, else 1 */
    int failed;              /* sticky status of an earlier failure */
    /* The draw's view of the step (planner.c): the sources of positive
     * weight, in index order, with their fixed-point weights, and the tokens
     * drawn so far in the step (g): a source's target is its step-start
     * target plus w * g, applied to p->src[].target at the step's end. */
    int64_t *act;            /* [n_sources] */
    int64_t *act_w;          /* [n_sources]: weights in units of 2^-48 */
    int64_t n_act;
    int64_t g;               /* tokens drawn in this step */
    int has_caps;            /* some source has max_epochs */
    /* Classes (planner.c): the sources of positive weight grouped by equal
     * weight and target at the step's start.  Members of a class keep equal
     * targets through the step, so the one with the largest deficit is the
     * one with the fewest drawn tokens (then the lowest index): a 4-ary heap
     * per class.  The classes' deficits are lines in g (slope: the weight);
     * the largest is found by a scan of the lines for up to PL__TN_SCAN_MAX
     * classes, by a kinetic tournament over them beyond (tn_*). */
    int use_cls;             /* 0: the linear reference draw (tests) */
    int draw_linear;         /* tests: always the linear draw (the reference) */
    int64_t n_cls;
    int64_t *cls_w;          /* [n_cls]: weight (units of 2^-48) */
    pl__i128 *cls_t;         /* [n_cls]: target at the step's start */
    int64_t *cls_off, *cls_size, *cls_hs; /* members in heap[off, off+size),
                                             the first hs of them in the heap */
    int64_t *cls_of;         /* [n_sources]: class of a source */
    pl__hent *heap;          /* [n_sources]: members, heap order first */
    int64_t *hpos;           /* [n_sources]: position of a source in heap */
    int64_t *cls_hash;       /* [cls_hash_cap]: class grouping scratch */
    int64_t cls_hash_cap;
    int64_t open_src;        /* concat_chunk, class path: source of the
                                partly drawn document, -1 if none */
    /* The tournament: a complete binary tree of tn_m leaves (tn_m a power of
     * two >= n_cls), node v's children 2v and 2v + 1, leaf of class c at
     * tn_m + c.  tn_node[v].win: the class with the largest deficit below v
     * at the current g (-1: none); .min: the smallest g at which some
     * comparison below v may change (a lower bound; INT64_MAX: never).
     * tn_line[c]: class c's deficit at g = 0 (cls_t minus the drawn tokens
     * of its top member), its weight (the slope) and that member's index
     * (ties). */
    int64_t tn_m;
    int64_t tn_scan_max;     /* PL__TN_SCAN_MAX (tests and benchmarks: 0, always
                                the tree) */
    int tn_scan;             /* few classes (<= tn_scan_max): no tree; the
                                draw scans tn_line[0, n_cls) (leaf .win: -1
                                for an empty class) */
    pl__tnode *tn_node;      /* [2 * tn_m] */
    pl__tline *tn_line;      /* [n_sources] */
    /* Look-ahead (planner.c, pl__next_document): source i's document at
     * position ahead[i].at of epoch ahead[i].epoch's order is ahead[i].doc
     * (at -1: none), computed and prefetched when the document before it
     * was taken.  A cache of pl__perm_apply, not state. */
    pl__ahead *ahead;        /* [n_sources] */
    /* packing scratch (pack.c) */
    void *pack;
    /* concat_chunk: the act[] slot of the source whose document is partly
       drawn (its next chunk is drawn before any other), -1 if none. */
    int64_t open_act;
    /* split (config `split`): source i's documents are [doc_lo[i],
       doc_lo[i] + num_docs[i]) of the source; an evaluation pass (cfg->eval)
       reads them in index order, once, and ends with PL_DONE. */
    int64_t *doc_lo;         /* [n_sources] */
    int spent;               /* eval: every source is read */
    /* A step resumed in its middle under other weights (state.c): step
     * pin_step is planned with pin_w (the weights it was begun with, by
     * this config's source index; 0 for a source the state does not
     * name), not the config's, so that its remaining micro-batches are the
     * ones of its first plan; after it, the targets restart at the drawn
     * tokens, as at a step-boundary resume with new weights.  A
     * state of pin_step's start records pin_w and pin_hash (the mixture its
     * targets belong to).  pin_step is -1 when no step is pinned. */
    int64_t pin_step;
    double *pin_w;           /* [n_sources] */
    uint64_t pin_hash;
    /* balance_window (window.c): the window of steps [win_start, win_start +
       win_steps) packed at its start (-1: none); the counters and carry at
       its start (for state blobs of its later steps); its chunks, their
       sequence within their step, their order by step (win_order, step j at
       [win_off[j], win_off[j+1])); scratch.  win_skip_to: a state loaded
       inside a window (the planner stands at the window's start and serves
       this step first), -1 if none. */
    int64_t win_start, win_steps, win_skip_to;
    pl__src_state *win_src;
    pl__chunks win_carry;
    pl__chunks win_chunks;
    struct pl__bins { int32_t *v; int64_t n, cap; } win_bins;
    int64_t *win_order, *win_off;
    pl_chunk *win_scratch;
    int32_t *win_scratch_bins;
};
typedef struct pl__bins pl__bins;
int pl__bins_push(pl__bins *b, int32_t v);

/* Padded length of a chunk of `len` tokens in a sequence. */
static inline int64_t pl__padded(const pl_planner *p, int64_t len) {
    return (len + p->align - 1) / p->align * p->align;
}

/* Draw the next chunk by the mixture rule; PL_OK or an error (message in p).
 * Only between pl__planner_draw_begin and pl__planner_draw_end. */
int pl__planner_draw(pl_planner *p, pl_chunk *out);
/* Set up the draws of a step from p->weights, and bring p->src up to date
 * after them (pl_planner_next calls both around the packing). */
void pl__planner_draw_begin(pl_planner *p);
void pl__planner_draw_end(pl_planner *p);

/* Packing: turn carry + drawn chunks into a plan (pack.c). */
int pl__pack_step(pl_planner *p, pl_plan **out);
/* The plan of packed chunks (balance and pl__make_plan); bin_of is scratch. */
int pl__pack_plan(pl_planner *p, const pl_chunk *placed, int64_t n,
                  int32_t *bin_of, pl_plan **out);
/* Pack one step and append its chunks and their sequences (0..G-1). */
int pl__pack_window_step(pl_planner *p, pl__chunks *into, pl__bins *bins);
/* The weights of p->step and its source checks; after its draws. */
int pl__planner_step_weights(pl_planner *p);
void pl__planner_step_done(pl_planner *p);
/* balance_window > 1: plan p->step from its window (window.c). */
int pl__window_next(pl_planner *p, pl_plan **out);
void pl__window_free(pl_planner *p);
void pl__pack_free(void *pack);

/*
 * Build a plan from placed chunks and their bins: the plan's sequences
 * 0..N-1, N = dp * nmb * rows with the rows of pl__mb_rows (N = G but under
 * balance: variable_length, where a sequence is a micro-batch's one row).
 * arrangement[r * N/dp + mb * rows + row] = sequence of that slot, or NULL
 * for round-robin (sequence q to rank q % dp).
 */
int pl__make_plan(pl_planner *p, const pl_chunk *placed, int64_t n,
                  const int32_t *bin_of, const int64_t *arrangement,
                  pl_plan **out);
/* Cost-aware arrangement of a packed step (balance.c): bin_of[0..n) holds
 * the packed sequences of the chunks and receives the plan's sequences
 * (pl__make_plan); arrangement [N] receives the slots. */
int pl__balance(pl_planner *p, const pl_chunk *placed, int64_t n,
                int32_t *bin_of, int64_t *arrangement);

/* Cost model (cost.c). */
double pl__chunk_cost(const pl_config *cfg, int64_t len);
double pl__sequence_cost(const pl_config *cfg, const pl_chunk *c, int64_t n);
/* The image encoder's cost of a chunk (0 without cost.encoder, for text
 * sources, and for chunks that do not hold their sample's image). */
double pl__chunk_encoder_cost(const pl_planner *p, const pl_chunk *ch);
/* Is an encoder term configured and some source a webdataset? */
int pl__has_encoder_cost(const pl_planner *p);

/* Hash of the mixture settings (weights and schedule). */
uint64_t pl__mixture_hash(const pl_config *cfg);
/* Hash of the other settings a step's plan depends on that may change at a
 * step boundary: balance, long_short, the cost model (with balance), and
 * each source's max_epochs (by name). */
uint64_t pl__arrangement_hash(const pl_config *cfg);

/* State blob (state.c).  mb_cursor and dp are written as given. */
int pl__state_encode(const pl_planner *p, int64_t mb_cursor, void **buf,
                     size_t *len);
/*
 * Decode into p, validating the blob, its fingerprint and that its
 * micro-batch cursor is in [0, nmb) and (mid-step) was saved with this dp
 * (dp <= 0: any).  Nothing of p changes unless it returns PL_OK; then
 * *mb_cursor receives the cursor.
 */
int pl__state_decode(pl_planner *p, const void *buf, size_t len, int64_t nmb,
                     int64_t dp, int64_t *mb_cursor);

/* Check that micro-batch mb of dp_rank (both in range) indexes only what
 * the plan holds: rank_sequences slots, sequences, chunk ranges, chunk
 * lengths in [1, seq_length] (reads.c; a plan may be built by hand).
 * PL_EINVAL with a message in err otherwise. */
int pl__plan_check_rows(const pl_plan *plan, int64_t dp_rank, int64_t mb, char *err,
                        size_t errcap);

/* The plan with the arrays it owns (pack.c allocates, pl_plan_free frees). */
typedef struct pl__plan_impl {
    pl_plan pub;
    pl_chunk *chunks;
    int64_t *seq_offsets, *seq_tokens, *rank_sequences;
    double *seq_cost, *rank_cost;
    double *rank_enc_cost; /* NULL without an encoder term */
} pl__plan_impl;

#endif
