/*
 * reads.c -- what a plan asks of the sources: the reads of one micro-batch
 * of a DP rank (pl_plan_reads), in the order the data constructor consumes
 * them, and the check that a micro-batch indexes only what the plan holds.
 * Both the wire messages (a package carries a rank's reads) and the data
 * constructor (which builds from them) call down to here.
 */
#include "planner/planner.h"

/*
 * Check that micro-batch mb of dp_rank indexes only what the plan holds
 * (its rank_sequences slots, sequences and chunk ranges): pl_plan_decode
 * checks decoded plans, but a plan may be built by hand in C.  dp_rank and
 * mb are in range.  PL_EINVAL with a message otherwise.
 */
int pl__plan_check_rows(const pl_plan *plan, int64_t dp_rank, int64_t mb, char *err,
                        size_t errcap) {
    const int64_t rows = plan->micro_batch_size, n = plan->n_sequences;
    if (rows <= 0 || n <= 0 || plan->n_chunks < 0 || !plan->rank_sequences ||
        !plan->seq_offsets || (plan->n_chunks > 0 && !plan->chunks) ||
        plan->seq_length <= 0 || plan->seq_length > PL__MAX_SEQ_LENGTH ||
        plan->micro_batches_per_rank > n / plan->dp / rows) {
        pl__fmt(err, errcap,
                "plan: %lld sequences, %lld chunks do not hold dp %lld x "
                "%lld micro-batches x %lld rows",
                (long long)n, (long long)plan->n_chunks, (long long)plan->dp,
                (long long)plan->micro_batches_per_rank, (long long)rows);
        return PL_EINVAL;
    }
    for (int64_t row = 0; row < rows; row++) {
        int64_t q = plan->rank_sequences[(dp_rank * plan->micro_batches_per_rank +
                                          mb) * rows + row];
        if (q < 0 || q >= n || plan->seq_offsets[q] < 0 ||
            plan->seq_offsets[q] > plan->seq_offsets[q + 1] ||
            plan->seq_offsets[q + 1] > plan->n_chunks) {
            pl__fmt(err, errcap,
                    "plan: row %lld of micro-batch %lld of DP rank %lld names "
                    "sequence %lld, or its chunk range is outside [0, %lld]",
                    (long long)row, (long long)mb, (long long)dp_rank,
                    (long long)q, (long long)plan->n_chunks);
            return PL_EINVAL;
        }
        /* Lengths bounded, so counts (length + 1) and sums cannot overflow. */
        for (int64_t j = plan->seq_offsets[q]; j < plan->seq_offsets[q + 1]; j++) {
            int64_t len = plan->chunks[j].length;
            if (len <= 0 || len > plan->seq_length) {
                pl__fmt(err, errcap,
                        "plan: chunk %lld has length %lld, outside [1, "
                        "seq_length %lld]",
                        (long long)j, (long long)len, (long long)plan->seq_length);
                return PL_EINVAL;
            }
        }
    }
    return PL_OK;
}

static int plan_reads_impl(const pl_plan *plan, int64_t dp_rank, int64_t mb, pl_read *out,
                           int64_t cap, int64_t *n) {
    if (!plan || dp_rank < 0 || dp_rank >= plan->dp || mb < 0 ||
        mb >= plan->micro_batches_per_rank || !n)
        return PL_ERANGE;
    char err[PL__ERRMSG_CAP];
    if (pl__plan_check_rows(plan, dp_rank, mb, err, sizeof err)) return PL_EINVAL;
    int64_t k = 0;
    const int64_t rows = plan->micro_batch_size;
    for (int64_t row = 0; row < rows; row++) {
        int64_t q = plan->rank_sequences[(dp_rank * plan->micro_batches_per_rank +
                                          mb) * rows + row];
        for (int64_t j = plan->seq_offsets[q]; j < plan->seq_offsets[q + 1]; j++) {
            const pl_chunk *c = &plan->chunks[j];
            if (out && k < cap) {
                out[k].source = c->source;
                out[k].reserved = 0;
                out[k].index = c->index;
                out[k].offset = c->offset;
                out[k].count = c->length + ((c->flags & PL_CHUNK_DOC_END) ? 0 : 1);
            }
            k++;
        }
    }
    *n = k;
    return out && k > cap ? PL_EINVAL : PL_OK;
}

int pl_plan_reads(const pl_plan *plan, int64_t dp_rank, int64_t mb, pl_read *out, int64_t cap,
                  int64_t *n) {
    int rc = plan_reads_impl(plan, dp_rank, mb, out, cap, n);
    if (rc < 0) pl__thread_err("plan: bad plan, rank, micro-batch or capacity");
    return rc;
}
