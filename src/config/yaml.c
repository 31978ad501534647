/*
 * config/yaml.c -- the YAML configuration of SPEC section 5, walked once.
 *
 * The file is loaded with libyaml's document API and walked into a struct
 * pl_config (config.h).  Every top-level scalar key, nested ones included
 * ("topology.dp", "cost.preset"), is a row of the key table and goes through
 * pl__key_set (keys.c), so that the walk and pl_config_set share their
 * parsing, defaults and messages; the keys of sources, images, tokenizers
 * and the schedule are read here, with names, ranges and values from their
 * rows.  An unknown key is an error that suggests the closest known key
 * beside it ("pretrain.yaml:7: unknown key 'seq_lenght' (did you mean
 * 'seq_length'?)").  Cross-key checks run after the walk (validate.c).
 *
 * Warnings (pl_config_warning) record what a parse accepted but a user may
 * not have meant: weights that do not sum to 1 (they are normalized), a
 * schedule point that leaves a source out (its weight there is 0), source
 * weights that a schedule overrides, seq_length left at its default.  They
 * are collected while walking the YAML, with the line, and belong to the
 * parse: pl_config_set neither adds nor clears them.
 *
 * Cost presets set a, b and c; explicit a, b or c keys override them,
 * whatever their position in the YAML mapping.  pl_config_set("cost.preset")
 * resets a, b, c (and window) to the preset's values.
 *
 * Parsing touches no file: source paths are checked when a source opens
 * (source/open.c), where a path that matches nothing is a config error
 * naming the config file and line, not a data error.
 */
#include "config/config.h"

#include <inttypes.h>
#include <math.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

typedef struct walk {
    pl_config *cfg;
    yaml_document_t *doc;
    pl__vlines ln;
    int weight_line;   /* line of the first explicit sources[i].weight */
    int64_t weight_of; /* ... and its source */
    pl__names names; /* source names -> index (walk_sources) */
} walk;

static int line_of(const yaml_node_t *n) {
    return (int)n->start_mark.line + 1;
}

static yaml_node_t *node(walk *w, int id) {
    return yaml_document_get_node(w->doc, id);
}

static const char *type_name(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_SCALAR_NODE: return "a scalar";
    case YAML_SEQUENCE_NODE: return "a list";
    case YAML_MAPPING_NODE: return "a mapping";
    default: return "nothing";
    }
}

static pl__sval scalar_of(const yaml_node_t *n) {
    pl__sval v;
    v.s = (const char *)n->data.scalar.value;
    v.quoted = n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE &&
               n->data.scalar.style != YAML_ANY_SCALAR_STYLE;
    v.line = line_of(n);
    return v;
}

/* Check that `n` is a mapping whose keys are distinct scalars. */
static int cmp_key(const void *a, const void *b) {
    const yaml_node_t *x = *(yaml_node_t *const *)a, *y = *(yaml_node_t *const *)b;
    int c = strcmp((const char *)x->data.scalar.value,
                   (const char *)y->data.scalar.value);
    if (c) return c;
    /* equal keys: the later one (by line) second, to report it */
    return (x->start_mark.index > y->start_mark.index) -
           (x->start_mark.index < y->start_mark.index);
}

static int check_mapping(walk *w, yaml_node_t *n, const char *what) {
    if (n->type != YAML_MAPPING_NODE)
        return pl__cfg_err(w->cfg, PL_ECONFIG, line_of(n),
                       "%s: expected a mapping, got %s", what, type_name(n));
    yaml_node_pair_t *b = n->data.mapping.pairs.start;
    yaml_node_pair_t *e = n->data.mapping.pairs.top;
    size_t count = (size_t)(e - b);
    yaml_node_t **keys = pl__calloc(count ? count : 1, sizeof *keys);
    if (!keys) return pl__cfg_err(w->cfg, PL_ENOMEM, line_of(n), "out of memory");
    for (size_t i = 0; i < count; i++) {
        yaml_node_t *k = node(w, b[i].key);
        if (!k || k->type != YAML_SCALAR_NODE) {
            free(keys);
            return pl__cfg_err(w->cfg, PL_ECONFIG, k ? line_of(k) : 0,
                           "%s: keys must be scalars", what);
        }
        keys[i] = k;
    }
    /* Duplicates: sort the keys, compare neighbours (n log n). */
    if (count > 1) qsort(keys, count, sizeof *keys, cmp_key);
    for (size_t i = 1; i < count; i++) {
        if (strcmp((const char *)keys[i]->data.scalar.value,
                   (const char *)keys[i - 1]->data.scalar.value) == 0) {
            int line = line_of(keys[i]);
            char key[128];
            pl__fmt(key, sizeof key, "%s", (const char *)keys[i]->data.scalar.value);
            free(keys);
            return pl__cfg_err(w->cfg, PL_ECONFIG, line, "%s: duplicate key '%s'",
                           what, key);
        }
    }
    free(keys);
    return PL_OK;
}

static const char *key_str(walk *w, const yaml_node_pair_t *p) {
    return (const char *)node(w, p->key)->data.scalar.value;
}

/*
 * "unknown key 'K'" for `shown` (the key as messages name it), at `line`,
 * with the key of the table under `prefix` that is closest to `name` when
 * one is close, and the keys `expected` there when not NULL.
 */
static int unknown_key(walk *w, int line, const char *shown, const char *prefix,
                       const char *name, const char *expected) {
    char cand[128], near[256];
    int has = pl__key_suggest(prefix, name, 0, cand, sizeof cand);
    /* The suggestion as `shown` names keys: "sources[1].weight". */
    const size_t sl = strlen(shown), nl = strlen(name);
    const int tail = sl >= nl && strcmp(shown + sl - nl, name) == 0;
    pl__fmt(near, sizeof near, "%.*s%s", tail ? (int)(sl - nl) : 0, shown, cand);
    if (!expected)
        return has ? pl__cfg_err(w->cfg, PL_ECONFIG, line,
                                 "unknown key '%s' (did you mean '%s'?)", shown, near)
                   : pl__cfg_err(w->cfg, PL_ECONFIG, line, "unknown key '%s'", shown);
    return pl__cfg_err(w->cfg, PL_ECONFIG, line, "unknown key '%s' (%s%s%sexpected %s)",
                       shown, has ? "did you mean '" : "", has ? near : "",
                       has ? "'? " : "", expected);
}

/* unknown_key for a key of the table's mapping `prefix`, listing the keys
 * there. */
static int unknown_key_in(walk *w, int line, const char *shown, const char *prefix,
                          const char *name) {
    char expected[400];
    pl__key_children(prefix, expected, sizeof expected);
    return unknown_key(w, line, shown, prefix, name, expected);
}

/* Set the scalar `value` node under dotted key `key` (whose key node is on
 * line `key_line`). */
static int set_node(walk *w, const char *key, int key_line,
                    yaml_node_t *value) {
    const pl__key *row = pl__key_find(key);
    if (!row || !row->size) {
        const char *dot = strrchr(key, '.');
        char prefix[128];
        pl__fmt(prefix, sizeof prefix, "%.*s", dot ? (int)(dot + 1 - key) : 0, key);
        return unknown_key(w, key_line, key, prefix, dot ? dot + 1 : key, NULL);
    }
    if (value->type != YAML_SCALAR_NODE)
        return pl__cfg_err(w->cfg, PL_ECONFIG, line_of(value),
                       "%s: expected a scalar, got %s", key,
                       type_name(value));
    pl__sval v = scalar_of(value);
    return pl__key_set(w->cfg, key, &v);
}

/* Is top-level key `name` a mapping of top-level scalar keys (rows
 * "name.KEY" with a field: topology, cost, long_short)? */
static int is_section(const char *name) {
    const size_t n = strlen(name);
    for (int i = 0; i < pl__n_keys; i++)
        if (pl__keys[i].size && strncmp(pl__keys[i].name, name, n) == 0 &&
            pl__keys[i].name[n] == '.')
            return 1;
    return 0;
}

/* topology, cost, long_short: a mapping of scalars. */
static int walk_submap(walk *w, const char *name, yaml_node_t *map) {
    int rc = check_mapping(w, map, name);
    if (rc != PL_OK) return rc;
    char key[128];
    yaml_node_pair_t *b = map->data.mapping.pairs.start;
    yaml_node_pair_t *e = map->data.mapping.pairs.top;
    /* cost.preset first, so that a, b, c override it in any order. */
    for (int pass = 0; pass < 2; pass++) {
        for (yaml_node_pair_t *p = b; p < e; p++) {
            const char *k = key_str(w, p);
            int is_preset = strcmp(name, "cost") == 0 &&
                            strcmp(k, "preset") == 0;
            if (is_preset != (pass == 0)) continue;
            pl__fmt(key, sizeof key, "%s.%s", name, k);
            if (strcmp(key, "topology.order") == 0)
                w->ln.order = line_of(node(w, p->key));
            if (strncmp(key, "cost.", 5) == 0 && !w->ln.cost)
                w->ln.cost = line_of(node(w, p->key));
            yaml_node_t *vn = node(w, p->value);
            if (strcmp(key, "cost.encoder") == 0 && vn->type == YAML_MAPPING_NODE) {
                /* cost.encoder: {a, b}, the image encoder's term */
                if ((rc = check_mapping(w, vn, key)) != PL_OK) return rc;
                char sub[160];
                for (yaml_node_pair_t *q = vn->data.mapping.pairs.start;
                     q < vn->data.mapping.pairs.top; q++) {
                    pl__fmt(sub, sizeof sub, "%s.%s", key, key_str(w, q));
                    rc = set_node(w, sub, line_of(node(w, q->key)), node(w, q->value));
                    if (rc != PL_OK) return rc;
                }
                continue;
            }
            rc = set_node(w, key, line_of(node(w, p->key)), vn);
            if (rc != PL_OK) return rc;
        }
    }
    if (strcmp(name, "cost") == 0 && !w->ln.cost) w->ln.cost = line_of(map);
    return PL_OK;
}

/* sources[i].image: {mode, size, patch_size, merge_size, min_pixels,
 * max_pixels, token_id, limit_pixels, caption_token_offset}. */
static int walk_image(walk *w, const char *what, yaml_node_t *map,
                      pl_image_options *o, int *verify) {
    pl_config *cfg = w->cfg;
    int rc = check_mapping(w, map, what);
    if (rc != PL_OK) return rc;
    char key[160];
    int has_token = 0;
    o->token_id = -1;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        pl__fmt(key, sizeof key, "%s.%s", what, k);
        if (vn->type != YAML_SCALAR_NODE)
            return pl__cfg_err(cfg, PL_ECONFIG, line_of(vn), "%s: expected a scalar, got %s",
                           key, type_name(vn));
        pl__sval v = scalar_of(vn);
        int en = 0;
        char row_name[96];
        pl__fmt(row_name, sizeof row_name, "sources[].image.%s", k);
        const pl__key *row = pl__key_find(row_name);
        if (!row)
            return unknown_key_in(w, line_of(node(w, p->key)), key, "sources[].image.",
                                  k);
        if (strcmp(k, "mode") == 0) {
            if ((rc = pl__key_enum(cfg, key, &v, row, &en))) return rc;
            o->mode = (pl_image_mode)en;
            continue;
        }
        if (strcmp(k, "verify") == 0) {
            if (strcmp(v.s, "true") && strcmp(v.s, "false"))
                return pl__cfg_err(cfg, PL_ECONFIG, v.line,
                                   "%s: expected true or false, got '%s'", key, v.s);
            *verify = strcmp(v.s, "true") == 0;
            continue;
        }
        /* The integers, in the table's order. */
        static const char *const names[] = {"size", "patch_size", "merge_size",
                                            "min_pixels", "max_pixels", "token_id",
                                            "limit_pixels", "caption_token_offset"};
        int64_t *dst[] = {&o->size, &o->patch_size, &o->merge_size, &o->min_pixels,
                          &o->max_pixels, &o->token_id, &o->limit_pixels,
                          &o->caption_token_offset};
        int j = 0;
        while (j < 8 && strcmp(k, names[j])) j++;
        if (j == 8) return unknown_key_in(w, line_of(node(w, p->key)), key,
                                          "sources[].image.", k);
        if ((rc = pl__key_row_int(cfg, row, key, &v, dst[j]))) return rc;
        has_token |= j == 5;
    }
    if (!has_token)
        return pl__cfg_err(cfg, PL_ECONFIG, line_of(map),
                       "%s: token_id (the image placeholder token) is required", what);
    const int64_t f = (o->patch_size ? o->patch_size : 14) *
                      (o->merge_size ? o->merge_size : (o->mode == PL_IMAGE_NATIVE ? 2 : 1));
    if (o->mode != PL_IMAGE_NATIVE && (o->size ? o->size : 336) % f)
        return pl__cfg_err(cfg, PL_ECONFIG, line_of(map),
                       "%s.size %lld is not a multiple of patch_size * merge_size = %lld",
                       what, (long long)(o->size ? o->size : 336), (long long)f);
    if (o->min_pixels && o->max_pixels && o->min_pixels > o->max_pixels)
        return pl__cfg_err(cfg, PL_ECONFIG, line_of(map), "%s: min_pixels > max_pixels",
                       what);
    return PL_OK;
}

/* A `tokenizer:` mapping: {type, path, add_eos, threads}. */
/* chat_template: "chatml", or {system, user, assistant} strings, each with
 * {content} once (checked when the source opens). */
static int walk_chat(walk *w, const char *key, yaml_node_t *vn, char **chat) {
    pl_config *cfg = w->cfg;
    static const char *const roles[3] = {"system", "user", "assistant"};
    for (int k = 0; k < 3; k++) free(chat[k]), chat[k] = NULL;
    if (vn->type == YAML_SCALAR_NODE) {
        pl__sval v = scalar_of(vn);
        if (strcmp(v.s, "chatml") != 0)
            return pl__cfg_err(cfg, PL_ECONFIG, v.line,
                           "%s: unknown value '%s' (expected chatml, or a mapping of "
                           "system, user and assistant)",
                           key, v.s);
        for (int k = 0; k < 3; k++) {
            char b[96];
            pl__fmt(b, sizeof b, "<|im_start|>%s\n{content}<|im_end|>\n", roles[k]);
            if (!(chat[k] = pl__strdup(b))) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
        }
        return PL_OK;
    }
    int rc = check_mapping(w, vn, key);
    if (rc != PL_OK) return rc;
    for (yaml_node_pair_t *p = vn->data.mapping.pairs.start;
         p < vn->data.mapping.pairs.top; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *xn = node(w, p->value);
        char full[200];
        pl__fmt(full, sizeof full, "%s.%s", key, k);
        int r = strcmp(k, "system") == 0 ? 0 : strcmp(k, "user") == 0 ? 1
                : strcmp(k, "assistant") == 0 ? 2 : -1;
        if (r < 0)
            return pl__cfg_err(cfg, PL_ECONFIG, line_of(node(w, p->key)),
                           "unknown key '%s' (expected system, user, assistant)", full);
        if (xn->type != YAML_SCALAR_NODE)
            return pl__cfg_err(cfg, PL_ECONFIG, line_of(xn), "%s: expected a string", full);
        pl__sval v = scalar_of(xn);
        const char *at = strstr(v.s, "{content}");
        if (!at || strstr(at + 9, "{content}"))
            return pl__cfg_err(cfg, PL_ECONFIG, v.line, "%s must hold {content} once", full);
        free(chat[r]);
        if (!(chat[r] = pl__strdup(v.s))) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    }
    for (int k = 0; k < 3; k++)
        if (!chat[k])
            return pl__cfg_err(cfg, PL_ECONFIG, line_of(vn), "%s: missing key '%s'", key,
                           roles[k]);
    return PL_OK;
}

static int walk_tokenizer(walk *w, const char *what, yaml_node_t *map,
                          pl__tok_cfg *t) {
    pl_config *cfg = w->cfg;
    char key[160];
    pl__fmt(key, sizeof key, "%s.tokenizer", what[0] ? what : "");
    const char *base = what[0] ? key : "tokenizer";
    int rc = check_mapping(w, map, base);
    if (rc != PL_OK) return rc;
    pl__tok_cfg_free(t);
    memset(t, 0, sizeof *t);
    t->set = 1;
    t->add_eos = 1;
    t->threads = 0; /* auto */
    t->line = line_of(map);
    int has_type = 0;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        char full[200];
        pl__fmt(full, sizeof full, "%s.%s", base, k);
        char row_name[96];
        pl__fmt(row_name, sizeof row_name, "tokenizer.%s", k);
        const pl__key *row = pl__key_find(row_name);
        if (!row)
            return unknown_key(w, line_of(node(w, p->key)), full, "tokenizer.", k,
                               "type, path, add_eos, threads, for tiktoken "
                               "pat_str or encoding, for hf backend");
        if (vn->type != YAML_SCALAR_NODE)
            return pl__cfg_err(cfg, PL_ECONFIG, line_of(vn),
                           "%s: expected a scalar, got %s", full, type_name(vn));
        pl__sval v = scalar_of(vn);
        if (pl__key_null(&v))
            return pl__cfg_err(cfg, PL_ECONFIG, v.line, "%s: missing value", full);
        if (strcmp(k, "type") == 0) {
            rc = pl__key_enum(cfg, full, &v, row, &t->type);
            has_type = 1;
        } else if (strcmp(k, "path") == 0 || strcmp(k, "pat_str") == 0 ||
                   strcmp(k, "encoding") == 0 || strcmp(k, "backend") == 0) {
            if (k[0] == 'b' && strcmp(v.s, "auto") && strcmp(v.s, "fastokens") &&
                strcmp(v.s, "tokenizers"))
                return pl__cfg_err(cfg, PL_ECONFIG, v.line,
                                   "%s: unknown value '%s' (expected auto, fastokens or "
                                   "tokenizers)",
                                   full, v.s);
            char **dst = strcmp(k, "path") == 0      ? &t->path
                         : strcmp(k, "pat_str") == 0 ? &t->pat_str
                         : strcmp(k, "backend") == 0 ? &t->backend
                                                     : &t->encoding;
            free(*dst);
            *dst = pl__strdup(v.s);
            if (!*dst) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
        } else if (strcmp(k, "add_eos") == 0) {
            if (strcmp(v.s, "true") == 0 || strcmp(v.s, "1") == 0)
                t->add_eos = 1;
            else if (strcmp(v.s, "false") == 0 || strcmp(v.s, "0") == 0)
                t->add_eos = 0;
            else
                return pl__cfg_err(cfg, PL_ECONFIG, v.line,
                               "%s: expected true or false, got '%s'", full, v.s);
        } else if (strcmp(k, "threads") == 0) {
            int64_t th = 0;
            rc = pl__key_threads(cfg, full, &v, row->max, &th);
            t->threads = (int)th; /* 0: auto */
        } else { /* a row of the table this walk does not read */
            return unknown_key(w, line_of(node(w, p->key)), full, "tokenizer.", k, NULL);
        }
        if (rc != PL_OK) return rc;
    }
    if (!has_type)
        return pl__cfg_err(cfg, PL_ECONFIG, t->line,
                       "%s: missing key 'type' (bytes, hf, sentencepiece or "
                       "tiktoken)",
                       base);
    if (t->type != PL__TOK_BYTES && (!t->path || !t->path[0]))
        return pl__cfg_err(cfg, PL_ECONFIG, t->line, "%s: missing key 'path'", base);
    if (t->backend && strcmp(t->backend, "auto") == 0) {
        free(t->backend);
        t->backend = NULL;
    }
    if (t->type != PL__TOK_HF && t->backend)
        return pl__cfg_err(cfg, PL_ECONFIG, t->line, "%s: backend applies only to type hf",
                           base);
    if (t->type != PL__TOK_TIKTOKEN && (t->pat_str || t->encoding))
        return pl__cfg_err(cfg, PL_ECONFIG, t->line,
                       "%s: %s applies only to type tiktoken", base,
                       t->pat_str ? "pat_str" : "encoding");
    if (t->type == PL__TOK_TIKTOKEN && !t->pat_str == !t->encoding)
        return pl__cfg_err(cfg, PL_ECONFIG, t->line,
                       "%s: a tiktoken tokenizer needs %s: 'encoding' (a published "
                       "encoding's name, e.g. r50k_base, cl100k_base or o200k_base: its "
                       "pattern and special tokens) or 'pat_str' (the pre-tokenizer "
                       "regex)",
                       base, t->pat_str ? "one of them, not both" : "one of");
    return PL_OK;
}

int pl__tok_cfg_dup(pl__tok_cfg *dst, const pl__tok_cfg *src) {
    *dst = *src;
    dst->path = src->path ? pl__strdup(src->path) : NULL;
    dst->pat_str = src->pat_str ? pl__strdup(src->pat_str) : NULL;
    dst->encoding = src->encoding ? pl__strdup(src->encoding) : NULL;
    dst->backend = src->backend ? pl__strdup(src->backend) : NULL;
    return (src->path && !dst->path) || (src->pat_str && !dst->pat_str) ||
                   (src->encoding && !dst->encoding) || (src->backend && !dst->backend)
               ? PL_ENOMEM
               : PL_OK;
}

void pl__tok_cfg_free(pl__tok_cfg *t) {
    free(t->path);
    free(t->pat_str);
    free(t->encoding);
    free(t->backend);
    t->path = t->pat_str = t->encoding = t->backend = NULL;
}

static int walk_source(walk *w, const char *list, int64_t i, yaml_node_t *map,
                       pl__source_cfg *s, pl__names *names) {
    pl_config *cfg = w->cfg;
    char what[64];
    char key[96];
    const int main_list = strcmp(list, "sources") == 0;
    pl__fmt(what, sizeof what, "%s[%" PRId64 "]", list, i);
    int rc = check_mapping(w, map, what);
    if (rc != PL_OK) return rc;
    s->type = (pl_source_type)0;
    s->eos_id = -1;
    s->weight = 1.0;
    s->token_dtype = (pl_dtype)0;
    /* The options kept out of line: parsed into x, dropped at the end when the
     * source sets none (on an error the config's free releases them). */
    pl__source_ext *x = s->x ? s->x : pl__calloc(1, sizeof *x);
    if (!x) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    s->x = x;
    int line_tdtype = 0, line_eos = 0, line_path = 0, has_type = 0, line_image = 0;
    int line_text = 0, line_key = 0; /* keys of jsonl/text sources */
    int line_tkey = 0, line_sft = 0, line_msg = 0, line_chat = 0;
    yaml_node_pair_t *b = map->data.mapping.pairs.start;
    yaml_node_pair_t *e = map->data.mapping.pairs.top;
    for (yaml_node_pair_t *p = b; p < e; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        pl__fmt(key, sizeof key, "%s.%s", what, k);
        char row_name[96];
        pl__fmt(row_name, sizeof row_name, "sources[].%s", k);
        const pl__key *row = strchr(k, '.') ? NULL : pl__key_find(row_name);
        if (!row)
            return unknown_key_in(w, line_of(node(w, p->key)), key, "sources[].", k);
        if (strcmp(k, "image") == 0) {
            rc = walk_image(w, key, vn, &x->image, &x->verify_images);
            if (rc != PL_OK) return rc;
            line_image = line_of(vn);
            continue;
        } else if (strcmp(k, "tokenizer") == 0) {
            rc = walk_tokenizer(w, what, vn, &x->tok);
            if (rc != PL_OK) return rc;
            line_text = line_of(node(w, p->key));
            continue;
        } else if (strcmp(k, "chat_template") == 0) {
            rc = walk_chat(w, key, vn, x->chat);
            if (rc != PL_OK) return rc;
            line_text = line_key = line_chat = line_of(node(w, p->key));
            continue;
        }
        if (vn->type != YAML_SCALAR_NODE)
            return pl__cfg_err(cfg, PL_ECONFIG, line_of(vn),
                           "%s: expected a scalar, got %s", key,
                           type_name(vn));
        pl__sval v = scalar_of(vn);
        if (pl__key_null(&v))
            return pl__cfg_err(cfg, PL_ECONFIG, v.line, "%s: missing value", key);
        int en = 0;
        if (strcmp(k, "name") == 0) {
            free(s->name);
            s->name = pl__strdup(v.s);
            if (!s->name) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
        } else if (strcmp(k, "path") == 0) {
            free(s->path);
            s->path = pl__strdup(v.s);
            if (!s->path) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
            line_path = v.line;
        } else if (strcmp(k, "type") == 0) {
            rc = pl__key_enum(cfg, key, &v, row, &en);
            if (rc != PL_OK) return rc;
            s->type = (pl_source_type)en;
            has_type = 1;
        } else if (strcmp(k, "token_dtype") == 0) {
            rc = pl__key_enum(cfg, key, &v, row, &en);
            if (rc != PL_OK) return rc;
            s->token_dtype = (pl_dtype)en;
            line_tdtype = v.line;
        } else if (strcmp(k, "eos_id") == 0) {
            rc = pl__key_row_int(cfg, row, key, &v, &s->eos_id);
            if (rc != PL_OK) return rc;
            line_eos = v.line;
        } else if (strcmp(k, "max_epochs") == 0) {
            rc = pl__key_row_int(cfg, row, key, &v, &s->max_epochs);
            if (rc != PL_OK) return rc;
        } else if (strcmp(k, "split") == 0) {
            if (!main_list)
                return pl__cfg_err(cfg, PL_ECONFIG, v.line,
                               "%s: %s are read whole; split applies to "
                               "sources",
                               key, list);
            rc = pl__split_parse(cfg, key, &v, s->split);
            if (rc != PL_OK) return rc;
            s->has_split = 1;
        } else if (strcmp(k, "caption") == 0) {
            if (strlen(v.s) >= sizeof x->image.caption_key ||
                (strcmp(v.s, "txt") && (strncmp(v.s, "json:", 5) || !v.s[5])))
                return pl__cfg_err(cfg, PL_ECONFIG, v.line,
                               "%s: expected txt or json:FIELD, got '%s'", key, v.s);
            pl__fmt(x->image.caption_key, sizeof x->image.caption_key, "%s", v.s);
            line_image = line_image ? line_image : v.line;
        } else if (strcmp(k, "index") == 0) {
            rc = pl__key_enum(cfg, key, &v, row, &s->write_index);
            if (rc != PL_OK) return rc;
        } else if (strcmp(k, "text_key") == 0) {
            if (!v.s[0])
                return pl__cfg_err(cfg, PL_ECONFIG, v.line, "%s is empty", key);
            free(x->text_key);
            x->text_key = pl__strdup(v.s);
            if (!x->text_key) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
            line_text = v.line;
            line_key = v.line;
            line_tkey = v.line;
        } else if (strcmp(k, "messages_key") == 0) {
            if (!v.s[0])
                return pl__cfg_err(cfg, PL_ECONFIG, v.line, "%s is empty", key);
            free(x->messages_key);
            x->messages_key = pl__strdup(v.s);
            if (!x->messages_key) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
            line_text = line_key = line_msg = v.line;
        } else if (strcmp(k, "prompt_key") == 0 || strcmp(k, "response_key") == 0) {
            if (!v.s[0])
                return pl__cfg_err(cfg, PL_ECONFIG, v.line, "%s is empty", key);
            char **dst = k[0] == 'p' ? &x->prompt_key : &x->response_key;
            free(*dst);
            *dst = pl__strdup(v.s);
            if (!*dst) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
            line_text = v.line;
            line_key = v.line;
            line_sft = v.line;
        } else if (strcmp(k, "lookahead") == 0) {
            rc = pl__key_row_int(cfg, row, key, &v, &x->lookahead);
            if (rc != PL_OK) return rc;
            line_text = v.line;
        } else if (strcmp(k, "weight") == 0) {
            rc = pl__key_num(cfg, key, &v, &s->weight);
            if (rc != PL_OK) return rc;
            if (main_list && !w->weight_line) {
                w->weight_line = v.line;
                w->weight_of = i;
            }
        } else { /* a row of the table this walk does not read */
            return unknown_key_in(w, line_of(node(w, p->key)), key, "sources[].", k);
        }
    }
    const int line = line_of(map);
    if (!s->name)
        return pl__cfg_err(cfg, PL_ECONFIG, line, "%s: missing key 'name'", what);
    if (!s->name[0])
        return pl__cfg_err(cfg, PL_ECONFIG, line, "%s.name is empty", what);
    if (!has_type) {
        char types[200];
        pl__key_values("sources[].type", types, sizeof types);
        return pl__cfg_err(cfg, PL_ECONFIG, line, "%s (%s): missing key 'type' (%s)",
                           what, s->name, types);
    }
    if (!s->path)
        return pl__cfg_err(cfg, PL_ECONFIG, line, "%s (%s): missing key 'path'",
                       what, s->name);
    /* Duplicates through the name index: O(1) per source, not a scan. */
    if (pl__names_put(names, s->name, strlen(s->name), i) != -1)
        return pl__cfg_err(cfg, PL_ECONFIG, line,
                       "%s: duplicate source name '%s'", what, s->name);
    if (s->token_dtype && s->type != PL_SOURCE_FLAT)
        return pl__cfg_err(cfg, PL_ECONFIG, line_tdtype,
                       "%s.token_dtype applies only to flat sources "
                       "(source '%s' is %s)",
                       what, s->name, pl_source_type_name(s->type));
    if (s->type == PL_SOURCE_FLAT && !s->token_dtype)
        s->token_dtype = PL_DTYPE_UINT16;
    int is_text = pl__is_text_type(s->type);
    if (line_text && !is_text)
        return pl__cfg_err(cfg, PL_ECONFIG, line_text,
                       "%s: text_key, tokenizer and lookahead apply only to "
                       "jsonl, text and parquet sources (source '%s' is %s)",
                       what, s->name, pl_source_type_name(s->type));
    if (line_key && s->type != PL_SOURCE_JSONL &&
        !(s->type == PL_SOURCE_PARQUET && line_key == line_tkey && !line_sft &&
          !line_msg && !line_chat))
        return pl__cfg_err(cfg, PL_ECONFIG, line_key,
                       "%s.%s applies only to jsonl sources (source '%s' "
                       "is %s)",
                       what,
                       line_sft ? "prompt_key/response_key"
                       : line_msg || line_chat ? "messages_key/chat_template"
                                               : "text_key",
                       s->name, pl_source_type_name(s->type));
    if ((line_msg || line_chat) && (line_sft || line_tkey))
        return pl__cfg_err(cfg, PL_ECONFIG, line_msg ? line_msg : line_chat,
                       "%s (%s): messages_key is used instead of text_key, prompt_key "
                       "and response_key (give one kind)",
                       what, s->name);
    if (line_msg && !x->chat[0])
        return pl__cfg_err(cfg, PL_ECONFIG, line_msg,
                       "%s (%s): messages_key needs chat_template (chatml, or "
                       "{system, user, assistant} strings with {content})",
                       what, s->name);
    if (line_chat && !x->messages_key)
        return pl__cfg_err(cfg, PL_ECONFIG, line_chat,
                       "%s (%s): chat_template needs messages_key", what, s->name);
    if (line_sft && (!x->prompt_key || !x->response_key))
        return pl__cfg_err(cfg, PL_ECONFIG, line_sft,
                       "%s (%s): instruction data needs both prompt_key and "
                       "response_key",
                       what, s->name);
    if (line_sft && line_tkey)
        return pl__cfg_err(cfg, PL_ECONFIG, line_tkey,
                       "%s (%s): text_key is not used with prompt_key and "
                       "response_key (give one or the other)",
                       what, s->name);
    if (line_eos && s->type == PL_SOURCE_MEGATRON)
        return pl__cfg_err(cfg, PL_ECONFIG, line_eos,
                       "%s.eos_id applies only to llmc and flat sources "
                       "(source '%s' is megatron)",
                       what, s->name);
    if (s->type == PL_SOURCE_WEBDATASET && !line_image)
        return pl__cfg_err(cfg, PL_ECONFIG, line,
                       "%s (%s): a webdataset source needs 'image' (with token_id)",
                       what, s->name);
    if (s->type != PL_SOURCE_WEBDATASET && line_image)
        return pl__cfg_err(cfg, PL_ECONFIG, line_image,
                       "%s: image and caption apply only to webdataset sources "
                       "(source '%s' is %s)",
                       what, s->name, pl_source_type_name(s->type));
    s->path_line = line_path; /* paths are checked when the source opens */
    if (memcmp(x, &pl__source_ext_none, sizeof *x) == 0) {
        free(x); /* every option at its default: nothing out of line */
        s->x = NULL;
    }
    return PL_OK;
}

/* sources, valid_sources or test_sources: a list of source mappings into
 * *arr (*n counts those allocated, so that a failure frees them). */
static int walk_source_list(walk *w, const char *list, yaml_node_t *seq,
                            pl__source_cfg **arr, int64_t *count,
                            pl__names *names) {
    pl_config *cfg = w->cfg;
    if (seq->type != YAML_SEQUENCE_NODE)
        return pl__cfg_err(cfg, PL_ECONFIG, line_of(seq),
                       "%s: expected a list, got %s", list, type_name(seq));
    yaml_node_item_t *b = seq->data.sequence.items.start;
    yaml_node_item_t *e = seq->data.sequence.items.top;
    size_t n = (size_t)(e - b);
    if (n == 0)
        return pl__cfg_err(cfg, PL_ECONFIG, line_of(seq),
                       "%s: at least one source is required", list);
    *arr = pl__calloc(n, sizeof **arr);
    if (!*arr || pl__names_init(names, (int64_t)n) != PL_OK)
        return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    for (size_t i = 0; i < n; i++) {
        *count = (int64_t)i + 1;
        int rc = walk_source(w, list, (int64_t)i, node(w, b[i]), &(*arr)[i],
                             names);
        if (rc != PL_OK) return rc;
    }
    return PL_OK;
}

static int walk_sources(walk *w, yaml_node_t *seq) {
    return walk_source_list(w, "sources", seq, &w->cfg->sources,
                            &w->cfg->n_sources, &w->names);
}

/* valid_sources (part 0) or test_sources (part 1). */
static int walk_eval_sources(walk *w, int part, yaml_node_t *seq) {
    pl__names names = {0};
    int rc = walk_source_list(w, part ? "test_sources" : "valid_sources", seq,
                              &w->cfg->eval_sources[part],
                              &w->cfg->n_eval_sources[part], &names);
    pl__names_free(&names);
    if (rc != PL_OK) return rc;
    for (int64_t i = 0; i < w->cfg->n_eval_sources[part]; i++) {
        const pl__source_cfg *s = &w->cfg->eval_sources[part][i];
        if (!(s->weight >= 0) || !isfinite(s->weight))
            return pl__cfg_err(w->cfg, PL_ECONFIG, s->path_line,
                           "%s[%" PRId64 "].weight must be finite and >= 0",
                           part ? "test_sources" : "valid_sources", i);
    }
    return PL_OK;
}

static int64_t source_index(const walk *w, const char *name) {
    return pl__names_get(&w->names, name, strlen(name));
}

/* Warnings of schedule point k: sources it leaves out (weight 0 there) and
 * weights that do not sum to 1 (normalized). */
static int point_warnings(walk *w, int64_t k, yaml_node_t *wmap, double sum,
                          int line) {
    pl_config *cfg = w->cfg;
    const pl__sched_point *pt = &cfg->points[k];
    unsigned char *named = pl__calloc((size_t)cfg->n_sources, 1);
    if (!named) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    for (yaml_node_pair_t *q = wmap->data.mapping.pairs.start;
         q < wmap->data.mapping.pairs.top; q++)
        named[source_index(w, key_str(w, q))] = 1; /* names were checked */
    char list[256] = "";
    size_t used = 0;
    int64_t omitted = 0;
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        if (named[i]) continue;
        if (omitted < 8 && used < sizeof list) {
            int n = snprintf(list + used, sizeof list - used, "%s'%s'",
                             omitted ? ", " : "", cfg->sources[i].name);
            if (n > 0) used += (size_t)n;
        }
        omitted++;
    }
    free(named);
    int rc = PL_OK;
    if (omitted)
        rc = pl__cfg_warn(cfg, line,
                      "schedule.points[%" PRId64 "] (step %" PRId64
                      ") omits source%s %s%s: %s weight is 0 there",
                      k, pt->step, omitted > 1 ? "s" : "", list,
                      omitted > 8 ? ", ..." : "", omitted > 1 ? "their" : "its");
    if (rc == PL_OK && fabs(sum - 1.0) > 1e-6)
        rc = pl__cfg_warn(cfg, line,
                      "schedule.points[%" PRId64 "].weights sum to %g, not 1: "
                      "they are normalized (divided by %g)",
                      k, sum, sum);
    return rc;
}

/* Warnings of the whole config, after validation (see the file comment). */
static int config_warnings(walk *w) {
    pl_config *cfg = w->cfg;
    int rc = PL_OK;
    if (!w->ln.seq_length)
        rc = pl__cfg_warn(cfg, 0,
                      "seq_length is not set: using the default %" PRId64,
                      cfg->seq_length);
    if (rc == PL_OK && cfg->has_schedule && w->weight_line)
        rc = pl__cfg_warn(cfg, w->weight_line,
                      "sources[%" PRId64 "].weight ('%s') is ignored: the "
                      "schedule sets every weight",
                      w->weight_of, cfg->sources[w->weight_of].name);
    double sum = pl__source_weight_sum(cfg);
    if (rc == PL_OK && !cfg->has_schedule && fabs(sum - 1.0) > 1e-6) {
        char list[256] = "";
        size_t used = 0;
        for (int64_t i = 0; i < cfg->n_sources && i < 8 && used < sizeof list;
             i++) {
            int n = snprintf(list + used, sizeof list - used, "%s%s %.4g",
                             i ? ", " : "", cfg->sources[i].name,
                             cfg->sources[i].weight / sum);
            if (n > 0) used += (size_t)n;
        }
        rc = pl__cfg_warn(cfg, w->ln.sources,
                      "weights of sources sum to %g, not 1: they are "
                      "normalized to %s%s",
                      sum, list, cfg->n_sources > 8 ? ", ..." : "");
    }
    return rc;
}

static int walk_point(walk *w, int64_t k, yaml_node_t *map) {
    pl_config *cfg = w->cfg;
    char what[64];
    char key[160];
    pl__fmt(what, sizeof what, "schedule.points[%" PRId64 "]", k);
    int rc = check_mapping(w, map, what);
    if (rc != PL_OK) return rc;
    pl__sched_point *pt = &cfg->points[k];
    pt->weights = pl__calloc((size_t)cfg->n_sources, sizeof(double));
    if (!pt->weights) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    int has_step = 0, has_weights = 0, line_step = line_of(map);
    int line_weights = line_of(map);
    yaml_node_t *wmap = NULL;
    yaml_node_pair_t *b = map->data.mapping.pairs.start;
    yaml_node_pair_t *e = map->data.mapping.pairs.top;
    for (yaml_node_pair_t *p = b; p < e; p++) {
        const char *kk = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        pl__fmt(key, sizeof key, "%s.%s", what, kk);
        if (strcmp(kk, "step") == 0) {
            if (vn->type != YAML_SCALAR_NODE)
                return pl__cfg_err(cfg, PL_ECONFIG, line_of(vn),
                               "%s: expected an integer, got %s", key,
                               type_name(vn));
            pl__sval v = scalar_of(vn);
            rc = pl__key_row_int(cfg, pl__key_find("schedule.points[].step"), key, &v,
                                 &pt->step);
            if (rc != PL_OK) return rc;
            has_step = 1;
            line_step = v.line;
        } else if (strcmp(kk, "weights") == 0) {
            rc = check_mapping(w, vn, key);
            if (rc != PL_OK) return rc;
            line_weights = line_of(vn);
            wmap = vn;
            for (yaml_node_pair_t *q = vn->data.mapping.pairs.start;
                 q < vn->data.mapping.pairs.top; q++) {
                const char *sname = key_str(w, q);
                int64_t si = source_index(w, sname);
                if (si < 0)
                    return pl__cfg_err(cfg, PL_ECONFIG, line_of(node(w, q->key)),
                                   "%s: unknown source '%s'", key, sname);
                yaml_node_t *wn = node(w, q->value);
                char wkey[256];
                pl__fmt(wkey, sizeof wkey, "%s.%s", key, sname);
                if (wn->type != YAML_SCALAR_NODE)
                    return pl__cfg_err(cfg, PL_ECONFIG, line_of(wn),
                                   "%s: expected a number, got %s", wkey,
                                   type_name(wn));
                pl__sval v = scalar_of(wn);
                rc = pl__key_num(cfg, wkey, &v, &pt->weights[si]);
                if (rc != PL_OK) return rc;
            }
            has_weights = 1;
        } else {
            return unknown_key_in(w, line_of(node(w, p->key)), key,
                                  "schedule.points[].", kk);
        }
    }
    if (!has_step)
        return pl__cfg_err(cfg, PL_ECONFIG, line_of(map),
                       "%s: missing key 'step'", what);
    if (!has_weights)
        return pl__cfg_err(cfg, PL_ECONFIG, line_of(map),
                       "%s: missing key 'weights'", what);
    if (k > 0 && pt->step <= cfg->points[k - 1].step)
        return pl__cfg_err(cfg, PL_ECONFIG, line_step,
                       "%s.step: steps must increase (%" PRId64
                       " after %" PRId64 ")",
                       what, pt->step, cfg->points[k - 1].step);
    double sum = 0;
    for (int64_t i = 0; i < cfg->n_sources; i++) sum += pt->weights[i];
    if (!(sum > 0))
        return pl__cfg_err(cfg, PL_ECONFIG, line_weights,
                       "%s.weights sum to zero", what);
    if (!isfinite(sum))
        return pl__cfg_err(cfg, PL_ECONFIG, line_weights,
                       "%s.weights sum to infinity", what);
    return point_warnings(w, k, wmap, sum, line_weights);
}

static int walk_schedule(walk *w, yaml_node_t *map) {
    pl_config *cfg = w->cfg;
    int rc = check_mapping(w, map, "schedule");
    if (rc != PL_OK) return rc;
    yaml_node_t *points = NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        if (strcmp(k, "interpolation") == 0) {
            if (vn->type != YAML_SCALAR_NODE)
                return pl__cfg_err(cfg, PL_ECONFIG, line_of(vn),
                               "schedule.interpolation: expected a scalar, "
                               "got %s",
                               type_name(vn));
            pl__sval v = scalar_of(vn);
            rc = pl__key_enum(cfg, "schedule.interpolation", &v,
                              pl__key_find("schedule.interpolation"),
                              &cfg->interpolation);
            if (rc != PL_OK) return rc;
        } else if (strcmp(k, "points") == 0) {
            points = vn;
        } else {
            char shown[160];
            pl__fmt(shown, sizeof shown, "schedule.%s", k);
            return unknown_key_in(w, line_of(node(w, p->key)), shown, "schedule.", k);
        }
    }
    if (!points)
        return pl__cfg_err(cfg, PL_ECONFIG, line_of(map),
                       "schedule: missing key 'points'");
    if (points->type != YAML_SEQUENCE_NODE ||
        points->data.sequence.items.top == points->data.sequence.items.start)
        return pl__cfg_err(cfg, PL_ECONFIG, line_of(points),
                       "schedule.points: expected a non-empty list");
    yaml_node_item_t *b = points->data.sequence.items.start;
    size_t n = (size_t)(points->data.sequence.items.top - b);
    cfg->points = pl__calloc(n, sizeof *cfg->points);
    if (!cfg->points) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    cfg->has_schedule = 1;
    for (size_t k = 0; k < n; k++) {
        cfg->n_points = (int64_t)k + 1;
        rc = walk_point(w, (int64_t)k, node(w, b[k]));
        if (rc != PL_OK) return rc;
    }
    return PL_OK;
}

static int walk_root(walk *w) {
    pl_config *cfg = w->cfg;
    yaml_node_t *root = yaml_document_get_root_node(w->doc);
    if (!root)
        return pl__cfg_err(cfg, PL_ECONFIG, 0,
                       "empty configuration (missing key 'sources')");
    int rc = check_mapping(w, root, "configuration");
    if (rc != PL_OK) return rc;
    yaml_node_t *sources = NULL, *schedule = NULL, *eval_lists[2] = {NULL, NULL};
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
         p < root->data.mapping.pairs.top; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        if (strcmp(k, "sources") == 0) {
            sources = vn;
            w->ln.sources = line_of(node(w, p->key));
        } else if (strcmp(k, "schedule") == 0) {
            schedule = vn;
        } else if (strcmp(k, "valid_sources") == 0 ||
                   strcmp(k, "test_sources") == 0) {
            eval_lists[k[0] == 't'] = vn;
        } else if (strcmp(k, "tokenizer") == 0) {
            rc = walk_tokenizer(w, "", vn, &cfg->tok);
            if (rc != PL_OK) return rc;
        } else if (is_section(k)) { /* topology, cost, long_short */
            if (strcmp(k, "topology") == 0) cfg->topology.line = line_of(node(w, p->key));
            rc = walk_submap(w, k, vn);
            if (rc != PL_OK) return rc;
        } else {
            if (strcmp(k, "seq_length") == 0)
                w->ln.seq_length = line_of(node(w, p->key));
            if (strcmp(k, "global_batch_size") == 0)
                w->ln.global_batch_size = line_of(node(w, p->key));
            rc = set_node(w, k, line_of(node(w, p->key)), vn);
            if (rc != PL_OK) return rc;
        }
    }
    if (!sources)
        return pl__cfg_err(cfg, PL_ECONFIG, 0, "missing key 'sources'");
    rc = walk_sources(w, sources);
    if (rc != PL_OK) return rc;
    for (int part = 0; part < 2; part++)
        if (eval_lists[part]) {
            rc = walk_eval_sources(w, part, eval_lists[part]);
            if (rc != PL_OK) return rc;
        }
    /* Text sources without a tokenizer of their own take the top level's. */
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        pl__source_cfg *sc = &cfg->sources[i];
        if (!pl__is_text_type(sc->type)) continue;
        if (!pl__sx(sc)->tok.set && cfg->tok.set) {
            if (!sc->x && !(sc->x = pl__calloc(1, sizeof *sc->x)))
                return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
            if (pl__tok_cfg_dup(&sc->x->tok, &cfg->tok))
                return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
        }
        if (!pl__sx(sc)->tok.set)
            return pl__cfg_err(cfg, PL_ECONFIG, w->ln.sources,
                           "sources[%" PRId64 "] (%s): a %s source needs a "
                           "tokenizer (its own 'tokenizer' or a top-level one)",
                           i, sc->name, pl_source_type_name(sc->type));
    }
    if (schedule) {
        rc = walk_schedule(w, schedule);
        if (rc != PL_OK) return rc;
    }
    rc = pl__config_validate(cfg, &w->ln);
    if (rc != PL_OK) return rc;
    return config_warnings(w);
}

/*
 * Limits on the YAML text, checked before libyaml builds a document: a config
 * is never this large or deep, and libyaml's time grows faster than linearly
 * with nesting (100k nested mappings take a minute).
 */
#define PL__CONFIG_MAX_BYTES ((size_t)64 << 20)
#define PL__CONFIG_MAX_DEPTH 32

/* A pass over libyaml's events that refuses nesting deeper than the limit.
 * Syntax errors are left to the loader, which reports them. */
static int check_depth(pl_config *cfg, const char *yaml, size_t len) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory (libyaml)");
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    int rc = PL_OK, depth = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) break;
        yaml_event_type_t t = ev.type;
        int line = (int)ev.start_mark.line + 1;
        yaml_event_delete(&ev);
        if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) {
            if (++depth > PL__CONFIG_MAX_DEPTH) {
                rc = pl__cfg_err(cfg, PL_ECONFIG, line,
                             "YAML nesting deeper than the limit of %d "
                             "mappings and lists",
                             PL__CONFIG_MAX_DEPTH);
                break;
            }
        } else if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT) {
            depth--;
        } else if (t == YAML_STREAM_END_EVENT) {
            break;
        }
    }
    yaml_parser_delete(&parser);
    return rc;
}

static int config_parse_string_impl(const char *yaml, size_t len, const char *origin,
                           pl_config **out) {
    if (!out) return PL_EINVAL;
    *out = NULL;
    pl_config *cfg = pl__config_new(origin);
    if (!cfg) return PL_ENOMEM;
    *out = cfg;
    if (!yaml) return pl__cfg_err(cfg, PL_EINVAL, 0, "no YAML text");
    if (len > PL__CONFIG_MAX_BYTES)
        return pl__cfg_err(cfg, PL_ECONFIG, 0,
                       "configuration of %zu bytes is above the limit of %zu "
                       "bytes",
                       len, PL__CONFIG_MAX_BYTES);
    int drc = check_depth(cfg, yaml, len);
    if (drc != PL_OK) return drc;

    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser))
        return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory (libyaml)");
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        int rc = pl__cfg_err(cfg, PL_ECONFIG, (int)parser.problem_mark.line + 1,
                         "YAML syntax error: %s%s%s",
                         parser.problem ? parser.problem : "unknown problem",
                         parser.context ? " " : "",
                         parser.context ? parser.context : "");
        if (parser.error == YAML_MEMORY_ERROR)
            rc = pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory (libyaml)");
        yaml_parser_delete(&parser);
        return rc;
    }
    walk w;
    memset(&w, 0, sizeof w);
    w.cfg = cfg;
    w.doc = &doc;
    int rc = walk_root(&w);
    pl__names_free(&w.names);
    yaml_document_delete(&doc);
    if (rc == PL_OK) { /* one document per config: a second is a mistake */
        yaml_document_t more;
        if (!yaml_parser_load(&parser, &more)) {
            rc = pl__cfg_err(cfg, PL_ECONFIG, (int)parser.problem_mark.line + 1,
                         "YAML syntax error after the first document: %s",
                         parser.problem ? parser.problem : "unknown problem");
        } else {
            if (yaml_document_get_root_node(&more))
                rc = pl__cfg_err(cfg, PL_ECONFIG, (int)more.start_mark.line + 1,
                             "a second YAML document ('---'): a config is one "
                             "document");
            yaml_document_delete(&more);
        }
    }
    yaml_parser_delete(&parser);
#ifdef __GLIBC__
    /* libyaml's document (a node, its strings and pair arrays per key: ~2 KB
     * per source of a long source list) is freed by now, but glibc keeps the
     * freed pages resident, and a process that only parses the config (a
     * trainer's client) kept ~600 KB per 270 sources that way: give the free
     * pages back (after every parse, whatever its size, so that a process's
     * memory does not depend on whether its config crossed a threshold). */
    malloc_trim(0);
#endif
    return rc;
}

static int config_parse_file_impl(const char *path, pl_config **out) {
    if (!out) return PL_EINVAL;
    *out = NULL;
    if (!path) return PL_EINVAL;
    /* A file above the size limit is refused before it is read. */
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
        (uint64_t)st.st_size > (uint64_t)PL__CONFIG_MAX_BYTES) {
        pl_config *cfg = pl__config_new(path);
        if (!cfg) return PL_ENOMEM;
        *out = cfg;
        return pl__cfg_err(cfg, PL_ECONFIG, 0,
                       "configuration of %lld bytes is above the limit of %zu "
                       "bytes",
                       (long long)st.st_size, PL__CONFIG_MAX_BYTES);
    }
    void *buf = NULL;
    size_t n = 0;
    int e = 0;
    int rc = pl__read_file(path, &buf, &n, &e);
    if (rc) {
        pl_config *cfg = pl__config_new(path);
        if (!cfg) return PL_ENOMEM;
        *out = cfg;
        if (rc == PL_ENOMEM) return pl__cfg_err(cfg, PL_ENOMEM, -1, "out of memory");
        return pl__cfg_err(cfg, rc, -1, "cannot %s config '%s': %s",
                       rc == PL_ENOENT ? "open" : "read", path, strerror(e));
    }
    rc = pl_config_parse_string(buf, n, path, out);
    free(buf);
    return rc;
}

/* ------------------------------------------------ per-thread messages */

int pl_config_parse_string(const char *yaml, size_t len, const char *origin,
                           pl_config **out) {
    int rc = config_parse_string_impl(yaml, len, origin, out);
    if (rc < 0) pl__thread_err(*out ? pl_config_errmsg(*out) : "config: out of memory");
    return rc;
}

int pl_config_parse_file(const char *path, pl_config **out) {
    int rc = config_parse_file_impl(path, out);
    if (rc < 0) pl__thread_err(*out ? pl_config_errmsg(*out) : "config: out of memory");
    return rc;
}
