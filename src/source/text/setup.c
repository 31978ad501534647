/*
 * source/text/setup.c -- a raw text source's state from its options: the
 * tokenizer, the record keys (text, instruction, chat template), the
 * lookahead and cache budgets, the length cache's key and policy.
 */
#include "source/text/text.h"

#include <string.h>

int pl__text_init(pl_source *src, const pl_source_options *opts, char *err,
                  size_t errcap) {
    const char *name = opts->name && opts->name[0] ? opts->name
                       : opts->path                ? opts->path
                                                   : "(unnamed)";
    pl__text *t = pl__calloc(1, sizeof *t);
    if (!t) {
        pl__fmt(err, errcap, "out of memory");
        return PL_ENOMEM;
    }
    src->state = t;
    t->src = src;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->work_cv, NULL);
    pthread_cond_init(&t->done_cv, NULL);
    pthread_mutex_init(&t->pq_mu, NULL);
    atomic_init(&t->tokenized, 0);
    atomic_init(&t->tokenize_cpu_ns, 0);
    int v2 = opts->version >= 2;
    if (v2 && opts->tokenizer) {
        t->tok = *opts->tokenizer;
        t->have_tok = 1;
    }
    if (v2 && opts->lengths_fn) {
        t->lengths_fn = opts->lengths_fn;
        t->lengths_ctx = opts->lengths_ctx;
        t->lengths_source = opts->lengths_source;
        if (!t->have_tok) {
            pl_tokenizer_bytes(&t->tok); /* never called: lengths come from fn */
            t->tok.name = "lengths";
        }
    }
    if ((!t->have_tok && !t->lengths_fn) || t->tok.version != PL_TOKENIZER_VERSION ||
        !t->tok.encode_batch) {
        pl__fmt(err, errcap,
                "source %s: a %s source needs a tokenizer (pl_tokenizer of "
                "version %d with encode_batch)",
                name, src->ops->name, PL_TOKENIZER_VERSION);
        return PL_EINVAL;
    }
    t->text_key = pl__strdup(v2 && opts->text_key ? opts->text_key : "text");
    if (opts->version >= 3 && opts->prompt_key && opts->response_key) {
        if (!(src->ops->flags & PL__SRC_JSON)) {
            pl__fmt(err, errcap,
                    "source %s: prompt_key and response_key apply only to jsonl "
                    "sources",
                    name);
            return PL_EINVAL;
        }
        t->prompt_key = pl__strdup(opts->prompt_key);
        t->response_key = pl__strdup(opts->response_key);
        if (!t->prompt_key || !t->response_key) {
            pl__fmt(err, errcap, "out of memory");
            return PL_ENOMEM;
        }
        t->masked = 1;
    } else if (opts->version >= 3 && opts->messages_key) {
        if (!(src->ops->flags & PL__SRC_JSON)) {
            pl__fmt(err, errcap, "source %s: messages_key applies only to jsonl sources",
                    name);
            return PL_EINVAL;
        }
        t->messages_key = pl__strdup(opts->messages_key);
        if (!t->messages_key) {
            pl__fmt(err, errcap, "out of memory");
            return PL_ENOMEM;
        }
        for (int k = 0; k < 3; k++) {
            const char *tp = opts->chat_template[k];
            const char *at = tp ? strstr(tp, "{content}") : NULL;
            if (!at || strstr(at + 9, "{content}")) {
                pl__fmt(err, errcap,
                        "source %s: chat_template.%s must hold {content} once",
                        name, k == 0 ? "system" : k == 1 ? "user" : "assistant");
                return PL_EINVAL;
            }
            t->chat_pre[k] = pl__calloc((size_t)(at - tp) + 1, 1);
            t->chat_suf[k] = pl__strdup(at + 9);
            if (!t->chat_pre[k] || !t->chat_suf[k]) {
                pl__fmt(err, errcap, "out of memory");
                return PL_ENOMEM;
            }
            memcpy(t->chat_pre[k], tp, (size_t)(at - tp));
        }
        t->masked = 1;
    }
    t->add_eos = v2 ? opts->add_eos != 0 : 0;
    t->eos_id = opts->eos_id >= 0 ? opts->eos_id : t->tok.eos_id;
    t->nthreads = v2 && opts->tokenizer_threads > 0 ? opts->tokenizer_threads : 1;
    if (t->nthreads > 256) t->nthreads = 256;
    t->lookahead = v2 && opts->lookahead > 0 ? opts->lookahead : 512;
    t->max_record = v2 && opts->max_record_bytes > 0 ? opts->max_record_bytes
                                                     : (int64_t)100 << 20;
    t->cache_bytes = v2 && opts->cache_bytes > 0 ? opts->cache_bytes
                                                 : (int64_t)256 << 20;
    t->write_index = opts->write_index;
    if (opts->version >= 3 && opts->length_cache_key) {
        t->lc_key = opts->length_cache_key;
        t->lc_policy = opts->length_cache == 1 ? PL_INDEX_WRITE : opts->length_cache;
    }
    t->nbuckets = 1024;
    t->buckets = pl__calloc(t->nbuckets, sizeof *t->buckets);
    if (!t->text_key || !t->buckets) {
        pl__fmt(err, errcap, "out of memory");
        return PL_ENOMEM;
    }
    if (t->add_eos && t->eos_id < 0 && !t->lengths_fn) {
        pl__fmt(err, errcap,
                "source %s: add_eos is set but tokenizer %s has no "
                "end-of-document token (give eos_id)",
                name, t->tok.name ? t->tok.name : "");
        return PL_EINVAL;
    }
    return PL_OK;
}

