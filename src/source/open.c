/*
 * open.c -- opening the sources of a config: pl_source_options from a
 * source's config (keys, image options, length cache), its tokenizer built or
 * shared (tokenizer/share.c), and a path that matches nothing reported as the
 * config's mistake, naming the config file and line.  Parsing a config opens
 * nothing; the planner, the loader and the Ray source loaders call this when
 * they need a source.
 */
#include "source/source.h"

#include <glob.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static int path_exists(pl_source_type type, const char *path) {
    struct stat st;
    char buf[4096];
    if (type == PL_SOURCE_MEGATRON) {
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 1;
        pl__fmt(buf, sizeof buf, "%s.idx", path);
        if (stat(buf, &st) == 0) return 1;
    }
    glob_t g;
    int found = 0;
    if (glob(path, 0, NULL, &g) == 0) found = g.gl_pathc > 0;
    globfree(&g);
    if (!found && type == PL_SOURCE_MEGATRON) {
        pl__fmt(buf, sizeof buf, "%s.idx", path);
        if (glob(buf, 0, NULL, &g) == 0) found = g.gl_pathc > 0;
        globfree(&g);
    }
    return found;
}

/* The length-cache key of a raw text source: what decides its lengths (the
 * tokenizer's type and file bytes, add_eos, eos_id, the record keys).  0
 * (no cache) when the tokenizer file cannot be read. */
static uint64_t s_length_cache_key(const pl__source_cfg *sc) {
    const pl__source_ext *s = pl__sx(sc);
    uint64_t h = pl__hash64("pllen1", 6, 0);
    int32_t ti[2] = {s->tok.type, s->tok.add_eos};
    h = pl__hash64(ti, sizeof ti, h);
    h = pl__hash64(&sc->eos_id, sizeof sc->eos_id, h);
    const char *keys[7] = {s->text_key ? s->text_key : "text",
                           s->prompt_key ? s->prompt_key : "",
                           s->response_key ? s->response_key : "",
                           s->messages_key ? s->messages_key : "",
                           s->chat[0] ? s->chat[0] : "", s->chat[1] ? s->chat[1] : "",
                           s->chat[2] ? s->chat[2] : ""};
    for (int k = 0; k < 7; k++) h = pl__hash64(keys[k], strlen(keys[k]) + 1, h);
    if (s->tok.pat_str) h = pl__hash64(s->tok.pat_str, strlen(s->tok.pat_str) + 1, h);
    if (s->tok.encoding) h = pl__hash64(s->tok.encoding, strlen(s->tok.encoding) + 1, h);
    if (s->tok.path) {
        FILE *f = fopen(s->tok.path, "rb");
        if (!f) return 0;
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) h = pl__hash64(buf, n, h);
        int bad = ferror(f);
        fclose(f);
        if (bad) return 0;
    }
    return h ? h : 1;
}

/* The tokenizer of a `tokenizer:` setting: built in, or the factory's, as a
 * shared releasable wrapper (source/tokenizer/share.c).  On failure *out is a source
 * handle carrying the message (as a failed open). */
static int config_tokenizer(const pl_config *cfg, const pl__tok_cfg *t,
                                pl_tokenizer *tok, pl_source **out) {
    memset(tok, 0, sizeof *tok);
    if (t->type == PL__TOK_BYTES) {
        pl_tokenizer_bytes(tok);
        return PL_OK;
    }
    char err[PL__ERRMSG_CAP];
    int rc;
    pl_tokenizer_factory fn = cfg->tok_factory_spec ? NULL : cfg->tok_factory;
    pl_tokenizer_spec_factory spec_fn = cfg->tok_factory_spec;
#ifdef PL_WITH_SENTENCEPIECE
    if (t->type == PL__TOK_SENTENCEPIECE) fn = NULL, spec_fn = NULL; /* built in */
#endif
    err[0] = '\0';
    rc = pl__tokref_create(t->type, t->path ? t->path : "", t->pat_str, t->encoding,
                           t->backend, fn,
                           spec_fn, cfg->tok_factory_ctx, tok, err, sizeof err);
    if (rc == PL_OK) return PL_OK;
    /* Name the config file and the tokenizer's line: the path came from there. */
    char msg[PL__ERRMSG_CAP];
    if (t->line > 0)
        pl__fmt(msg, sizeof msg, "%s:%d: tokenizer: %s", cfg->origin ? cfg->origin : "<string>",
                t->line, err);
    else
        pl__fmt(msg, sizeof msg, "%s: tokenizer: %s", cfg->origin ? cfg->origin : "<string>",
                err);
    pl__fmt(err, sizeof err, "%s", msg);
    /* A handle for the message, as pl_source_open leaves one. */
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = 0; /* refused at once: the handle only carries the message */
    pl__source_open(&o, 0, out);
    if (*out) pl__source_set_err(*out, err);
    return rc;
}

/* A source's tokenizer threads: its `threads`, or for `auto` (0) the CPUs
 * this process may use less one for the threads that read the tokens. */
static int tok_threads(const pl__tok_cfg *t) {
    return t->threads > 0 ? t->threads : pl__threads_auto(pl_cpus_available(), 1);
}

int pl__config_open_source(const pl_config *cfg, int64_t i, pl_source **out) {
    if (out) *out = NULL;
    if (!cfg || !out) return PL_EINVAL;
    if (i < 0 || i >= cfg->n_sources) return PL_ERANGE;
    const pl__source_cfg *s = &cfg->sources[i];
    const pl__source_ext *sx = pl__sx(s);
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = s->type;
    o.path = s->path;
    o.name = s->name;
    o.token_dtype = s->token_dtype;
    o.eos_id = s->eos_id;
    o.write_index = s->write_index ? s->write_index : cfg->sidecar_index;
    o.image = s->type == PL_SOURCE_WEBDATASET ? &sx->image : NULL;
    o.verify_images = sx->verify_images;
    o.cache_dir = cfg->cache_dir[0] ? cfg->cache_dir : NULL;
    o.cache_max_bytes = cfg->cache_max_bytes;
    o.cache_chunk_bytes = cfg->cache_chunk_bytes;
    pl_tokenizer tok;
    if (pl__is_text_type(s->type)) {
        o.length_cache_key = s_length_cache_key(s);
        o.length_cache = s->write_index ? s->write_index : cfg->sidecar_index;
    }
    if (pl__is_text_type(s->type) && cfg->lengths_fn) {
        o.lengths_fn = cfg->lengths_fn;
        o.lengths_ctx = cfg->lengths_ctx;
        o.lengths_source = i;
        o.tokenizer_threads = tok_threads(&sx->tok);
        o.lookahead = sx->lookahead;
    } else if (pl__is_text_type(s->type)) {
        o.write_index = 0; /* record offsets in memory (1: write .plrec) */
        int trc = config_tokenizer(cfg, &sx->tok, &tok, out);
        if (trc) return trc;
        o.tokenizer = &tok;
        o.text_key = sx->text_key;
        o.prompt_key = sx->prompt_key;
        o.messages_key = sx->messages_key;
        for (int q = 0; q < 3; q++) o.chat_template[q] = sx->chat[q];
        o.response_key = sx->response_key;
        o.add_eos = sx->tok.add_eos;
        o.tokenizer_threads = tok_threads(&sx->tok);
        o.lookahead = sx->lookahead;
    }
    int rc = pl__source_open(&o, cfg->on_error == PL__ONERR_SKIP, out);
    if (rc == PL_ENOENT && *out && !path_exists(s->type, s->path)) {
        /* A path that matches nothing is the config's mistake: say which. */
        char msg[PL__ERRMSG_CAP], at[600];
        if (s->path_line > 0)
            pl__fmt(at, sizeof at, "%s:%d: ", cfg->origin ? cfg->origin : "<string>",
                    s->path_line);
        else
            at[0] = '\0';
        if (pl__remote_is_url(s->path)) /* the object that is missing, by its URL */
            pl__fmt(msg, sizeof msg, "%ssource '%s': path '%s' not found: %s", at,
                    s->name, s->path, pl_source_errmsg(*out));
        else if (s->type == PL_SOURCE_MEGATRON)
            pl__fmt(msg, sizeof msg,
                    "%ssource '%s': path '%s' not found (no '%s.idx', directory or "
                    "matching glob)",
                    at, s->name, s->path, s->path);
        else
            pl__fmt(msg, sizeof msg,
                    "%ssource '%s': path '%s' not found (no file or matching glob)", at,
                    s->name, s->path);
        pl__source_set_err(*out, msg);
        rc = PL_ECONFIG;
    }
    return rc;
}

int pl_config_open_source(const pl_config *cfg, int64_t i, pl_source **out) {
    return pl__config_open_source(cfg, i, out);
}

