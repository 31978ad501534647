/*
 * polyload.c -- the `polyload` command line tool (SPEC section 6).
 *
 *   polyload run CONFIG [--steps N] [--json] [--state-in F] [--state-out F]
 *                [--split valid|test]
 *                       [--threads N] [--no-progress]
 *   polyload plan CONFIG --steps A:B [--state-in F] [--rank R] [--json]
 *   polyload inspect PATH [--json] [--type megatron|llmc|flat] [--token-dtype T]
 *                    [--eos-id N]
 *   polyload index CONFIG [--json]
 *   polyload calibrate CSV [--json]
 *   polyload prepare ARGS...        (runs python -m polyload.prepare)
 *   polyload --version | help
 *
 * This is the only place that prints and picks exit codes: 0 on success, 1 on
 * a runtime or data error, 2 on a usage or configuration error.  `run` drives
 * an embedded loader that serves every rank of the topology, consuming
 * micro-batch by micro-batch across all ranks (so that no rank runs ahead of
 * its DP-group peers by more than one batch and the prefetch ring never
 * stalls).  `plan` drives the planner alone and prints its plans as JSON
 * Lines; it opens the sources with pl_config_open_source.  The CLI uses the
 * public header only.
 */
#include "polyload/polyload.h"
#include "polyload/polyload_experimental.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

static const char *usage_text =
    "usage: polyload <command> [options]\n"
    "\n"
    "commands:\n"
    "  run CONFIG [--steps N] [--json] [--state-in F] [--state-out F] [--split valid|test]\n"
    "             [--threads N] [--no-progress]\n"
    "      Build every micro-batch of every rank for N steps (default:\n"
    "      train_steps) and print a summary.\n"
    "  plan CONFIG --steps A:B [--state-in F] [--rank R] [--json]\n"
    "      Print the plans of steps A..B-1 as JSON Lines, one per (step,\n"
    "      dp_rank).\n"
    "  inspect PATH [--json] [--type megatron|llmc|flat]\n"
    "        [--token-dtype uint16|uint32] [--eos-id N]\n"
    "      Print statistics of a source (maps a .plidx sidecar if one\n"
    "      matches, writes none).  inspect CONFIG.yaml [--json]: of every\n"
    "      source of a config, raw text tokenized (Python package).\n"
    "  index CONFIG [--json]\n"
    "      Write the sidecar indexes of the config's sources (.plidx of llm.c\n"
    "      and flat files, .plwds of WebDataset shards; one writer under a\n"
    "      lock), so that loaders only map them; name what each source has.\n"
    "  keys [--json]\n"
    "      List every config key (type, default, range or values, meaning)\n"
    "      and every source type.\n"
    "  calibrate CSV [--json]\n"
    "      Fit the cost model time = a*tokens + b*sum_sq + c by least\n"
    "      squares to rows 'tokens,sum_sq,step_time' (a header line and\n"
    "      '#' comments allowed) and print a, b, c, r2 and rows.\n"
    "  prepare ARGS...\n"
    "      Tokenize text into sources (python -m polyload.prepare;\n"
    "      $POLYLOAD_PYTHON selects the interpreter).\n"
    "  check CONFIG [--json]\n"
    "      Parse every record of every source before a run (paths, tokenizer,\n"
    "      keys, each document; WebDataset images decoded) and summarize the\n"
    "      problems by file and line.\n"
    "  report CONFIG --steps A:B [--out FILE]\n"
    "      A picture of the plan: cost per DP rank and step (--out needs\n"
    "      matplotlib: pip install 'polyload[report]').\n"
    "  serve CONFIG --ray-address ADDR\n"
    "      Run the Ray deployment until interrupted (pip install 'polyload[ray]').\n"
    "  top --ray-address ADDR\n"
    "      A live view of a deployment's scaling (pip install 'polyload[ray]').\n"
    "      check, report, serve and top run in the Python package (as prepare).\n"
    "  help, --help       this text\n"
    "  --version          print the version\n"
    "\n"
    "exit status: 0 ok, 1 runtime or data error, 2 usage or config error\n";

/* ------------------------------------------------------------ messages */

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt,
                                                              ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("polyload: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n(see 'polyload help')\n", stderr);
    va_end(ap);
    return EXIT_USAGE;
}

static int fail(int exit_code, const char *msg, int status) {
    if (msg && msg[0])
        fprintf(stderr, "polyload: error: %s\n", msg);
    else
        fprintf(stderr, "polyload: error: %s\n", pl_strerror(status));
    return exit_code;
}

/* Config problems are usage errors; everything else is a runtime error. */
static int exit_for(int status) {
    return status == PL_ECONFIG || status == PL_ETOPOLOGY ? EXIT_USAGE
                                                          : EXIT_RUNTIME;
}

/* ------------------------------------------------------------ JSON */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p;
         p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

/* A number, or null when not finite.  `exact` prints all digits. */
static void json_num(FILE *f, double x, int exact) {
    if (!isfinite(x))
        fputs("null", f);
    else
        fprintf(f, exact ? "%.17g" : "%.6g", x);
}

/* ------------------------------------------------------------ arguments */

typedef struct args {
    const char *positional;
    const char *steps;
    const char *state_in;
    const char *state_out;
    const char *threads;
    const char *rank;
    const char *type;
    const char *token_dtype, *eos_id;
    const char *split;
    int json;
    int no_progress;
    int help;
} args;

/* Parse argv[first..argc) against the flags a command accepts ("steps
 * state-in ..."); flags take values as "--flag V" or "--flag=V". */
static int parse_args(int argc, char **argv, int first, const char *accepted,
                      args *a) {
    memset(a, 0, sizeof *a);
    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            a->help = 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (a->positional)
                return usage_error("%s: unexpected argument '%s'", argv[1],
                                   arg);
            a->positional = arg;
            continue;
        }
        char name[64];
        const char *eq = strchr(arg + 2, '=');
        size_t nl = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (nl >= sizeof name)
            return usage_error("%s: unknown option '%s'", argv[1], arg);
        memcpy(name, arg + 2, nl);
        name[nl] = '\0';
        /* Is the flag accepted by this command? */
        int ok = 0;
        const char *p = accepted;
        while (*p) {
            size_t l = strcspn(p, " ");
            if (l == nl && strncmp(p, name, nl) == 0) ok = 1;
            p += l;
            while (*p == ' ') p++;
        }
        if (!ok) return usage_error("%s: unknown option '%s'", argv[1], arg);
        if (strcmp(name, "json") == 0 || strcmp(name, "no-progress") == 0) {
            if (eq)
                return usage_error("%s: option --%s takes no value", argv[1],
                                   name);
            if (name[0] == 'j')
                a->json = 1;
            else
                a->no_progress = 1;
            continue;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (i + 1 >= argc)
                return usage_error("%s: option --%s needs a value", argv[1],
                                   name);
            val = argv[++i];
        }
        if (strcmp(name, "steps") == 0) a->steps = val;
        else if (strcmp(name, "state-in") == 0) a->state_in = val;
        else if (strcmp(name, "state-out") == 0) a->state_out = val;
        else if (strcmp(name, "threads") == 0) a->threads = val;
        else if (strcmp(name, "rank") == 0) a->rank = val;
        else if (strcmp(name, "type") == 0) a->type = val;
        else if (strcmp(name, "token-dtype") == 0) a->token_dtype = val;
        else if (strcmp(name, "eos-id") == 0) a->eos_id = val;
        else if (strcmp(name, "split") == 0) a->split = val;
    }
    return EXIT_OK;
}

/* A decimal integer in [min, max] filling the whole string. */
static int parse_int(const char *s, int64_t min, int64_t max, int64_t *out) {
    if (!s || !*s) return 0;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end || v < min || v > max) return 0;
    *out = (int64_t)v;
    return 1;
}

/* ------------------------------------------------------------ files */

static int read_file(const char *path, void **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    void *buf = size >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)size + 1) : NULL;
    size_t got = buf ? fread(buf, 1, (size_t)size, f) : 0;
    int bad = !buf || got != (size_t)size || ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return -1;
    }
    *data = buf;
    *len = got;
    return 0;
}

static int write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, len, f) == len;
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : -1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Set by a host that runs this CLI in its own process (the Python package,
 * python/polyload/_core/cli.c): called on every parsed config, e.g. to give
 * it the host's tokenizers. */
static void (*cli_config_hook)(pl_config *cfg);

/* Parse CONFIG; prints the error and returns the exit code on failure. */
/* Parse a config, print its warnings to stderr, and take topology.dp: auto
 * from $WORLD_SIZE (as torchrun sets it; without it dp stays 1). */
static int load_config(const char *path, pl_config **cfg) {
    int rc = pl_config_parse_file(path, cfg);
    if (rc == PL_OK && cli_config_hook) cli_config_hook(*cfg);
    if (rc == PL_OK) {
        for (int64_t i = 0; i < pl_config_num_warnings(*cfg); i++)
            fprintf(stderr, "polyload: warning: %s\n", pl_config_warning(*cfg, i));
        int64_t dp_auto = 0, world = 0;
        const char *env = getenv("WORLD_SIZE");
        if (pl_config_get_int(*cfg, "topology.dp_auto", &dp_auto) == PL_OK && dp_auto &&
            env && *env) {
            if (!parse_int(env, 1, INT32_MAX, &world)) {
                pl_config_free(*cfg);
                *cfg = NULL;
                return usage_error("WORLD_SIZE='%s' is not a positive integer", env);
            }
            rc = pl_config_set_world_size(*cfg, world);
        }
    }
    if (rc != PL_OK) {
        int code = fail(EXIT_USAGE, pl_config_errmsg(*cfg), rc);
        pl_config_free(*cfg);
        *cfg = NULL;
        return code;
    }
    return EXIT_OK;
}

/* ------------------------------------------------------------ run */

static void progress(int64_t done, int64_t total, int64_t tokens,
                     double secs) {
    const int width = 30;
    int filled = total > 0 ? (int)((double)width * (double)done /
                                   (double)total)
                           : 0;
    if (filled > width) filled = width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = '\0';
    double tps = secs > 0 ? (double)tokens / secs : 0.0;
    char eta[32] = "";
    if (done > 0 && total > done && secs > 0) {
        double left = secs * (double)(total - done) / (double)done;
        long long m = (long long)(left / 60.0), sec = (long long)left % 60;
        snprintf(eta, sizeof eta, "  ETA %lld:%02lld", m, sec);
    }
    fprintf(stderr, "\r[%s] %" PRId64 "/%" PRId64 " steps  %.3g tokens/s%s   ",
            bar, done, total, tps, eta);
    fflush(stderr);
}

static int cmd_run(int argc, char **argv) {
    args a;
    int code = parse_args(argc, argv, 2,
                          "steps json state-in state-out threads no-progress split",
                          &a);
    if (code) return code;
    if (a.help) {
        fputs(usage_text, stdout);
        return EXIT_OK;
    }
    if (!a.positional) return usage_error("run: missing CONFIG");
    int64_t steps = -1, threads = 0;
    if (a.steps && !parse_int(a.steps, 1, INT64_MAX, &steps))
        return usage_error("run: --steps wants a positive integer, got '%s'",
                           a.steps);
    if (a.threads && !parse_int(a.threads, 1, 4096, &threads))
        return usage_error("run: --threads wants a positive integer, got '%s'",
                           a.threads);

    if (a.state_out) { /* find an unwritable path before the run, not after */
        int existed = access(a.state_out, F_OK) == 0;
        FILE *probe = fopen(a.state_out, "ab");
        if (!probe)
            return usage_error("run: cannot write --state-out %s: %s", a.state_out,
                               strerror(errno));
        fclose(probe);
        if (!existed) unlink(a.state_out);
    }
    int split = 0;
    if (a.split) {
        if (strcmp(a.split, "valid") == 0) split = PL_SPLIT_VALID;
        else if (strcmp(a.split, "test") == 0) split = PL_SPLIT_TEST;
        else return usage_error("run: --split wants valid or test, got '%s'", a.split);
        if (a.state_in || a.state_out)
            return usage_error("run: --split is one evaluation pass; it takes no state");
    }
    pl_config *cfg = NULL;
    code = load_config(a.positional, &cfg);
    if (code) return code;
    if (split) { /* one evaluation pass (pl_config_split), to its end or --steps */
        pl_config *ev = NULL;
        int src = pl_config_split(cfg, split, &ev);
        pl_config_free(cfg);
        if (src != PL_OK) {
            code = fail(exit_for(src), ev ? pl_config_errmsg(ev) : pl_strerror(src), src);
            pl_config_free(ev);
            return code;
        }
        cfg = ev;
        if (steps < 0) steps = INT64_MAX;
    }
    int64_t train_steps = -1, mbpr = 0;
    pl_config_get_int(cfg, "train_steps", &train_steps);
    pl_config_get_int(cfg, "micro_batches_per_rank", &mbpr);
    if (steps < 0) {
        if (train_steps < 0) {
            pl_config_free(cfg);
            return usage_error("run: the config has no train_steps; pass "
                               "--steps N");
        }
        steps = train_steps;
    }
    const int64_t world = pl_config_world_size(cfg);

    void *blob = NULL;
    size_t blob_len = 0;
    if (a.state_in && read_file(a.state_in, &blob, &blob_len) != 0) {
        fprintf(stderr, "polyload: error: cannot read state '%s': %s\n",
                a.state_in, strerror(errno));
        pl_config_free(cfg);
        return EXIT_RUNTIME;
    }

    pl_loader_options opts;
    memset(&opts, 0, sizeof opts);
    opts.version = PL_LOADER_OPTIONS_VERSION;
    opts.threads = (int)threads;
    pl_loader *loader = NULL;
    int rc = pl_loader_create(cfg, &opts, &loader);
    pl_config_free(cfg);
    cfg = NULL;
    if (rc != PL_OK) {
        code = fail(exit_for(rc), pl_loader_errmsg(loader), rc);
        pl_loader_free(loader);
        free(blob);
        return code;
    }
    if (blob) {
        rc = pl_loader_set_state(loader, blob, blob_len);
        free(blob);
        if (rc != PL_OK) {
            code = fail(EXIT_RUNTIME, pl_loader_errmsg(loader), rc);
            pl_loader_free(loader);
            return code;
        }
    }

    const int bar = !a.no_progress && isatty(STDERR_FILENO) && steps != INT64_MAX;
    const double t0 = now_s();
    double last_draw = 0;
    int64_t done = 0;
    int finished = 0;
    for (int64_t s = 0; s < steps && !finished && rc == PL_OK; s++) {
        /* Micro-batch outermost: all ranks advance together. */
        for (int64_t mb = 0; mb < mbpr && !finished && rc == PL_OK; mb++) {
            for (int64_t r = 0; r < world; r++) {
                const pl_batch *b = NULL;
                rc = pl_loader_next(loader, r, &b);
                if (rc == PL_DONE) {
                    finished = 1;
                    rc = PL_OK;
                    break;
                }
                if (rc != PL_OK) break;
            }
        }
        if (!finished && rc == PL_OK) done++;
        if (bar) {
            double t = now_s();
            if (t - last_draw > 0.1 || done == steps) {
                pl_loader_stats now = {.size = sizeof now};
                if (pl_loader_get_stats(loader, &now, NULL, 0) == PL_OK)
                    progress(done, steps, now.tokens, t - t0);
                last_draw = t;
            }
        }
    }
    const double secs = now_s() - t0;
    if (bar) fputc('\n', stderr);
    if (rc != PL_OK) {
        code = fail(EXIT_RUNTIME, pl_loader_errmsg(loader), rc);
        pl_loader_free(loader);
        return code;
    }

    pl_loader_stats st = {.size = sizeof st};
    int64_t n_sources = pl_config_num_sources(pl_loader_config(loader));
    pl_source_summary *sums = calloc(n_sources > 0 ? (size_t)n_sources : 1, sizeof *sums);
    rc = sums ? pl_loader_get_stats(loader, &st, sums, n_sources) : PL_ENOMEM;
    if (rc != PL_OK) {
        code = fail(EXIT_RUNTIME, sums ? pl_loader_errmsg(loader) : "out of memory", rc);
        free(sums);
        pl_loader_free(loader);
        return code;
    }
    const double tps = secs > 0 ? (double)st.tokens / secs : 0.0;
    const int64_t all = st.tokens + st.padding_tokens;
    const double pad = all > 0 ? (double)st.padding_tokens / (double)all : 0.0;

    if (a.json) {
        FILE *o = stdout;
        fprintf(o, "{\"steps\": %" PRId64 ", \"tokens\": %" PRId64
                   ", \"padding_fraction\": ",
                st.steps, st.tokens);
        json_num(o, pad, 0);
        fputs(", \"tokens_per_s\": ", o);
        json_num(o, tps, 0);
        fputs(", \"seconds\": ", o);
        json_num(o, secs, 0);
        fprintf(o, ", \"skipped\": %" PRId64 ", \"imbalance\": {", st.skipped);
        fputs("\"max_over_mean\": ", o);
        if (st.max_over_mean > 0)
            json_num(o, st.max_over_mean, 0);
        else
            fputs("null", o);
        fputs(", \"max_over_lower_bound\": ", o);
        if (st.max_over_lower_bound > 0)
            json_num(o, st.max_over_lower_bound, 0);
        else
            fputs("null", o);
        fputs("}, \"sources\": {", o);
        for (int64_t i = 0; i < st.n_sources; i++) {
            const pl_source_summary *m = &st.sources[i];
            if (i) fputs(", ", o);
            json_str(o, m->name);
            fprintf(o, ": {\"documents\": %" PRId64 ", \"tokens\": %" PRId64
                       ", \"epochs_completed\": %" PRId64
                       ", \"realized_fraction\": ",
                    m->documents, m->tokens, m->epochs_completed);
            json_num(o, m->realized_fraction, 0);
            fputs(", \"scheduled_fraction\": ", o);
            json_num(o, m->scheduled_fraction, 0);
            fputc('}', o);
        }
        fputs("}}\n", o);
    } else {
        printf("steps              %" PRId64 "\n", st.steps);
        printf("tokens             %" PRId64 "\n", st.tokens);
        printf("padding            %.2f%%\n", 100.0 * pad);
        printf("tokens/s           %.4g\n", tps);
        printf("seconds            %.3f\n", secs);
        printf("skipped            %" PRId64 "\n", st.skipped);
        if (st.max_over_mean > 0)
            printf("imbalance          max/mean %.4f, max/lower bound %.4f\n",
                   st.max_over_mean, st.max_over_lower_bound);
        printf("sources:\n");
        for (int64_t i = 0; i < st.n_sources; i++) {
            const pl_source_summary *m = &st.sources[i];
            printf("  %-16s documents %-10" PRId64 " tokens %-12" PRId64
                   " epochs %-4" PRId64 " realized %.4f  scheduled %.4f\n",
                   m->name, m->documents, m->tokens, m->epochs_completed,
                   m->realized_fraction, m->scheduled_fraction);
        }
    }
    if (!bar)
        fprintf(stderr, "polyload: run: %" PRId64 " steps in %.3f s\n",
                st.steps, secs);
    free(sums);
    st.sources = NULL;

    if (a.state_out) {
        size_t len = 0;
        rc = pl_loader_get_state(loader, NULL, 0, &len);
        void *buf = rc == PL_OK ? malloc(len ? len : 1) : NULL;
        if (rc == PL_OK && !buf) rc = PL_ENOMEM;
        if (rc == PL_OK) rc = pl_loader_get_state(loader, buf, len, &len);
        if (rc != PL_OK) {
            free(buf);
            code = fail(EXIT_RUNTIME, pl_loader_errmsg(loader), rc);
            pl_loader_free(loader);
            return code;
        }
        if (write_file(a.state_out, buf, len) != 0) {
            fprintf(stderr, "polyload: error: cannot write state '%s': %s\n",
                    a.state_out, strerror(errno));
            free(buf);
            pl_loader_free(loader);
            return EXIT_RUNTIME;
        }
        free(buf);
    }
    pl_loader_free(loader);
    return EXIT_OK;
}

/* ------------------------------------------------------------ plan */

static const char *field_names[6] = {"input_ids",    "labels",
                                     "loss_mask",    "position_ids",
                                     "cu_seqlens",   "max_seqlen"};

/* One JSON line: the sequences of DP rank `r` in plan `p`. */
static void print_rank_plan(const pl_config *cfg, const pl_plan *p, int64_t r,
                            int64_t cp, const pl_rank_info *info, int json) {
    FILE *o = stdout;
    const int64_t mbpr = p->micro_batches_per_rank;
    const int64_t mbs = p->micro_batch_size;
    if (!json) {
        int64_t chunks = 0, tokens = 0;
        for (int64_t k = 0; k < mbpr * mbs; k++) {
            int64_t q = p->rank_sequences[r * mbpr * mbs + k];
            chunks += p->seq_offsets[q + 1] - p->seq_offsets[q];
            for (int64_t c = p->seq_offsets[q]; c < p->seq_offsets[q + 1]; c++)
                tokens += p->chunks[c].length;
        }
        fprintf(o, "step %" PRId64 " dp_rank %" PRId64 ": cost %.6g", p->step, r,
                p->rank_cost[r]);
        if (p->rank_encoder_cost)
            fprintf(o, " (backbone %.6g, encoder %.6g)",
                    p->rank_cost[r] - p->rank_encoder_cost[r], p->rank_encoder_cost[r]);
        fprintf(o, ", %" PRId64 " sequences, %" PRId64 " chunks, %" PRId64 " tokens\n",
                mbpr * mbs, chunks, tokens);
        return;
    }
    fprintf(o, "{\"step\": %" PRId64 ", \"dp_rank\": %" PRId64, p->step, r);
    if (info) {
        fprintf(o, ", \"pp_rank\": %" PRId64 ", \"cp_rank\": %" PRId64
                   ", \"tp_rank\": %" PRId64 ", \"fields\": [",
                info->pp_rank, info->cp_rank, info->tp_rank);
        int first = 1;
        for (int f = 0; f < 6; f++) {
            if (!(info->fields & (1u << f))) continue;
            if (!first) fputs(", ", o);
            json_str(o, field_names[f]);
            first = 0;
        }
        fputc(']', o);
    }
    fputs(", \"rank_cost\": ", o);
    json_num(o, p->rank_cost[r], 1);
    {   /* The step's figures (the same on every rank's line): the lower bound
           and what sets it (the mean rank, or one chunk costlier than it:
           only context parallelism for that sequence can help), and the
           largest gap between a source's share of the step's tokens and its
           weight (balance_window: exact over the window, not per step). */
        double total = 0, worst = 0;
        for (int64_t d = 0; d < p->dp; d++) total += p->rank_cost[d];
        const int64_t ns = pl_config_num_sources(cfg);
        double *tok = calloc((size_t)(ns > 0 ? ns : 1), sizeof *tok), all = 0;
        for (int64_t c = 0; c < p->n_chunks; c++) {
            double cc = pl_cost_sequence(cfg, &p->chunks[c].length, 1);
            if (cc > worst) worst = cc;
            if (tok && p->chunks[c].source >= 0 && p->chunks[c].source < ns)
                tok[p->chunks[c].source] += (double)p->chunks[c].length;
            all += (double)p->chunks[c].length;
        }
        double dev = 0;
        for (int64_t i = 0; tok && i < ns && all > 0; i++) {
            double d = tok[i] / all - pl_config_source_weight(cfg, i, p->step);
            if (fabs(d) > dev) dev = fabs(d);
        }
        free(tok);
        fputs(", \"step_lower_bound\": ", o);
        json_num(o, p->lower_bound, 1);
        fputs(", \"step_mean_rank_cost\": ", o);
        json_num(o, total / (double)p->dp, 1);
        fputs(", \"step_costliest_chunk\": ", o);
        json_num(o, worst, 1);
        fprintf(o, ", \"step_bound_by_chunk\": %s", worst > total / (double)p->dp ? "true" : "false");
        fputs(", \"step_mixture_deviation\": ", o);
        json_num(o, dev, 1);
    }
    if (p->rank_encoder_cost) { /* hybrid cost: both parts */
        fputs(", \"backbone_cost\": ", o);
        json_num(o, p->rank_cost[r] - p->rank_encoder_cost[r], 1);
        fputs(", \"encoder_cost\": ", o);
        json_num(o, p->rank_encoder_cost[r], 1);
    }
    fputs(", \"sequences\": [", o);
    for (int64_t mb = 0; mb < mbpr; mb++) {
        for (int64_t row = 0; row < mbs; row++) {
            int64_t q = p->rank_sequences[(r * mbpr + mb) * mbs + row];
            if (mb || row) fputs(", ", o);
            fprintf(o, "{\"micro_batch\": %" PRId64 ", \"cost\": ", mb);
            json_num(o, p->seq_cost[q], 1);
            fputs(", \"chunks\": [", o);
            for (int64_t c = p->seq_offsets[q]; c < p->seq_offsets[q + 1];
                 c++) {
                const pl_chunk *ch = &p->chunks[c];
                if (c > p->seq_offsets[q]) fputs(", ", o);
                fputc('[', o);
                json_str(o, pl_config_source_name(cfg, ch->source));
                fprintf(o, ", %" PRId64 ", %" PRId64 ", %" PRId64 "]",
                        ch->index, ch->offset, ch->length);
            }
            /* One row of SPEC 3: a segment per chunk (padded to a multiple
             * of 2*cp under CP), then the row's trailing padding. */
            fputs("], \"cu_seqlens\": [0", o);
            int64_t at = 0;
            for (int64_t c = p->seq_offsets[q]; c < p->seq_offsets[q + 1];
                 c++) {
                int64_t len = p->chunks[c].length;
                if (cp > 1) len = (len + 2 * cp - 1) / (2 * cp) * (2 * cp);
                at += len;
                fprintf(o, ", %" PRId64, at);
            }
            if (at < p->seq_length) fprintf(o, ", %" PRId64, p->seq_length);
            fputs("]}", o);
        }
    }
    fputs("]}\n", o);
}

static int cmd_plan(int argc, char **argv) {
    args a;
    int code = parse_args(argc, argv, 2, "steps state-in rank json", &a);
    if (code) return code;
    if (a.help) {
        fputs(usage_text, stdout);
        return EXIT_OK;
    }
    if (!a.positional) return usage_error("plan: missing CONFIG");
    if (!a.steps) return usage_error("plan: missing --steps A:B");
    int64_t from = 0, to = 0;
    {
        char buf[64];
        if (strlen(a.steps) >= sizeof buf)
            return usage_error("plan: bad --steps '%s'", a.steps);
        strcpy(buf, a.steps);
        char *colon = strchr(buf, ':');
        if (colon) {
            *colon = '\0';
            if (!parse_int(buf, 0, INT64_MAX, &from) ||
                !parse_int(colon + 1, 0, INT64_MAX, &to) || to < from)
                return usage_error("plan: --steps wants A:B with 0 <= A <= B, "
                                   "got '%s'",
                                   a.steps);
        } else if (!parse_int(buf, 0, INT64_MAX, &to)) {
            return usage_error("plan: --steps wants A:B, got '%s'", a.steps);
        }
    }

    pl_config *cfg = NULL;
    code = load_config(a.positional, &cfg);
    if (code) return code;
    int64_t rank = -1;
    pl_rank_info info;
    memset(&info, 0, sizeof info);
    if (a.rank) {
        int64_t world = pl_config_world_size(cfg);
        if (!parse_int(a.rank, 0, world - 1, &rank)) {
            int64_t t[4] = {0, 0, 0, 0};
            pl_config_get_int(cfg, "topology.dp", &t[0]);
            pl_config_get_int(cfg, "topology.pp", &t[1]);
            pl_config_get_int(cfg, "topology.cp", &t[2]);
            pl_config_get_int(cfg, "topology.tp", &t[3]);
            const char *env = getenv("WORLD_SIZE");
            pl_config_free(cfg);
            return usage_error("plan: --rank wants a rank in [0, %" PRId64
                               "), got '%s' (topology dp=%" PRId64 " pp=%" PRId64
                               " cp=%" PRId64 " tp=%" PRId64 "; WORLD_SIZE %s%s)",
                               world, a.rank, t[0], t[1], t[2], t[3],
                               env ? "is " : "not set", env ? env : "");
        }
        int rc = pl_config_rank_info(cfg, rank, &info);
        if (rc != PL_OK) {
            pl_config_free(cfg);
            return fail(exit_for(rc), pl_strerror(rc), rc);
        }
    }
    int64_t cp = 1;
    pl_config_get_int(cfg, "topology.cp", &cp);

    const int64_t n = pl_config_num_sources(cfg);
    pl_source **srcs = calloc((size_t)(n > 0 ? n : 1), sizeof *srcs);
    pl_planner *planner = NULL;
    void *blob = NULL;
    size_t blob_len = 0;
    int rc = srcs ? PL_OK : PL_ENOMEM;
    code = EXIT_OK;
    if (rc != PL_OK) code = fail(EXIT_RUNTIME, NULL, rc);
    for (int64_t i = 0; i < n && code == EXIT_OK; i++) {
        rc = pl_config_open_source(cfg, i, &srcs[i]);
        if (rc != PL_OK)
            code = fail(EXIT_RUNTIME, pl_source_errmsg(srcs[i]), rc);
    }
    if (code == EXIT_OK) {
        rc = pl_planner_create(cfg, srcs, n, &planner);
        if (rc != PL_OK)
            code = fail(exit_for(rc), pl_planner_errmsg(planner), rc);
    }
    if (code == EXIT_OK && a.state_in) {
        if (read_file(a.state_in, &blob, &blob_len) != 0) {
            fprintf(stderr, "polyload: error: cannot read state '%s': %s\n",
                    a.state_in, strerror(errno));
            code = EXIT_RUNTIME;
        } else {
            rc = pl_planner_set_state(planner, blob, blob_len);
            if (rc != PL_OK)
                code = fail(EXIT_RUNTIME, pl_planner_errmsg(planner), rc);
        }
    }
    /* Plan from the planner's position (0, or the state's step); plans
     * before `from` are computed and dropped. */
    int first = 1;
    while (code == EXIT_OK && from < to) {
        pl_plan *p = NULL;
        rc = pl_planner_next(planner, &p);
        if (rc == PL_DONE) break;
        if (rc != PL_OK) {
            code = fail(EXIT_RUNTIME, pl_planner_errmsg(planner), rc);
            break;
        }
        if (first && p->step > from) {
            fprintf(stderr,
                    "polyload: error: --state-in stands at step %" PRId64
                    ", after the first requested step %" PRId64 "\n",
                    p->step, from);
            pl_plan_free(p);
            code = EXIT_USAGE;
            break;
        }
        first = 0;
        if (p->step >= to) {
            pl_plan_free(p);
            break;
        }
        if (p->step >= from) {
            if (rank >= 0)
                print_rank_plan(cfg, p, info.dp_rank, cp, &info, a.json);
            else
                for (int64_t r = 0; r < p->dp; r++)
                    print_rank_plan(cfg, p, r, cp, NULL, a.json);
        }
        int64_t s = p->step;
        pl_plan_free(p);
        if (s + 1 >= to) break;
    }
    if (fflush(stdout) != 0 && code == EXIT_OK) {
        fprintf(stderr, "polyload: error: writing output: %s\n",
                strerror(errno));
        code = EXIT_RUNTIME;
    }
    free(blob);
    pl_planner_free(planner);
    for (int64_t i = 0; srcs && i < n; i++) pl_source_free(srcs[i]);
    free(srcs);
    pl_config_free(cfg);
    return code;
}

/* ------------------------------------------------------------ inspect */

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Guess a source's type from its path; *path_out is the path to open
 * (a Megatron file name loses its .idx/.bin extension). */
static pl_source_type guess_type(const char *path, char *path_out,
                                 size_t cap) {
    snprintf(path_out, cap, "%s", path);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return PL_SOURCE_MEGATRON;
    if (ends_with(path, ".idx")) {
        path_out[strlen(path) - 4] = '\0';
        return PL_SOURCE_MEGATRON;
    }
    if (ends_with(path, ".bin")) {
        FILE *f = fopen(path, "rb");
        int32_t magic = 0;
        if (f) {
            if (fread(&magic, sizeof magic, 1, f) != 1) magic = 0;
            fclose(f);
        }
        if (magic == 20240520 || magic == 20240801) return PL_SOURCE_LLMC;
        char idx[4096];
        snprintf(idx, sizeof idx, "%.*s.idx", (int)(strlen(path) - 4), path);
        if (file_exists(idx)) {
            path_out[strlen(path) - 4] = '\0';
            return PL_SOURCE_MEGATRON;
        }
        return PL_SOURCE_FLAT;
    }
    char idx[4096];
    snprintf(idx, sizeof idx, "%s.idx", path);
    if (file_exists(idx)) return PL_SOURCE_MEGATRON;
    if (strpbrk(path, "*?[")) { /* a glob: of Megatron prefixes, or of files */
        glob_t g;
        int megatron = 0;
        if (glob(idx, 0, NULL, &g) == 0) megatron = g.gl_pathc > 0;
        globfree(&g);
        if (megatron) return PL_SOURCE_MEGATRON;
        if (glob(path, 0, NULL, &g) == 0 && g.gl_pathc > 0) {
            char first[4096];
            snprintf(first, sizeof first, "%s", g.gl_pathv[0]);
            globfree(&g);
            char ignored[4096];
            pl_source_type t = guess_type(first, ignored, sizeof ignored);
            if (t == PL_SOURCE_MEGATRON && ends_with(path, ".idx"))
                path_out[strlen(path) - 4] = '\0';
            return t;
        }
        globfree(&g);
    }
    return PL_SOURCE_FLAT;
}

static int cmd_inspect(int argc, char **argv) {
    args a;
    int code = parse_args(argc, argv, 2, "json type token-dtype eos-id", &a);
    if (code) return code;
    if (a.help) {
        fputs(usage_text, stdout);
        return EXIT_OK;
    }
    if (!a.positional) return usage_error("inspect: missing PATH");
    char path[4096];
    pl_source_type type;
    if (a.type) {
        snprintf(path, sizeof path, "%s", a.positional);
        type = pl_source_type_from_name(a.type);
        if (type == PL_SOURCE_MEGATRON) {
            if (ends_with(path, ".idx") || ends_with(path, ".bin"))
                path[strlen(path) - 4] = '\0';
        } else if (type != PL_SOURCE_LLMC && type != PL_SOURCE_FLAT) {
            return usage_error("inspect: --type wants megatron, llmc or flat, "
                               "got '%s'",
                               a.type);
        }
    } else {
        type = guess_type(a.positional, path, sizeof path);
    }
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = type;
    o.path = path;
    o.eos_id = -1;
    o.token_dtype = type == PL_SOURCE_FLAT ? PL_DTYPE_UINT16 : (pl_dtype)0;
    if (a.token_dtype) {
        if (type != PL_SOURCE_FLAT)
            return usage_error("inspect: --token-dtype applies to flat files only");
        if (strcmp(a.token_dtype, "uint16") == 0) o.token_dtype = PL_DTYPE_UINT16;
        else if (strcmp(a.token_dtype, "uint32") == 0) o.token_dtype = PL_DTYPE_UINT32;
        else
            return usage_error("inspect: --token-dtype wants uint16 or uint32, got '%s'",
                               a.token_dtype);
    }
    if (a.eos_id) {
        if (type == PL_SOURCE_MEGATRON)
            return usage_error("inspect: --eos-id applies to llmc and flat files only");
        if (!parse_int(a.eos_id, 0, (int64_t)UINT32_MAX, &o.eos_id))
            return usage_error("inspect: --eos-id wants a token id, got '%s'", a.eos_id);
    }
    o.write_index = PL_INDEX_READ; /* inspecting writes no sidecar */
    pl_source *src = NULL;
    int rc = pl_source_open(&o, &src);
    pl_source_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    if (rc == PL_OK) rc = pl_source_get_stats(src, &st);
    if (rc != PL_OK) {
        code = fail(EXIT_RUNTIME, pl_source_errmsg(src), rc);
        pl_source_free(src);
        return code;
    }
    const char *tname = pl_source_type_name(type);
    const char *dname = pl_dtype_name(pl_source_token_dtype(src));
    if (a.json) {
        FILE *out = stdout;
        fputs("{\"type\": ", out);
        json_str(out, tname);
        fprintf(out, ", \"files\": %" PRId64 ", \"documents\": %" PRId64
                     ", \"tokens\": %" PRId64 ", \"token_dtype\": ",
                st.files, st.documents, st.tokens);
        json_str(out, dname);
        fprintf(out, ", \"length_percentiles\": {\"p50\": %" PRId64
                     ", \"p90\": %" PRId64 ", \"p99\": %" PRId64
                     ", \"max\": %" PRId64 "}}\n",
                st.length_p50, st.length_p90, st.length_p99, st.length_max);
    } else {
        printf("path               %s\n", path);
        printf("type               %s\n", tname);
        printf("files              %" PRId64 "\n", st.files);
        printf("documents          %" PRId64 "\n", st.documents);
        printf("tokens             %" PRId64 "\n", st.tokens);
        printf("token_dtype        %s\n", dname);
        printf("length p50/p90/p99/max  %" PRId64 " / %" PRId64 " / %" PRId64
               " / %" PRId64 "\n",
               st.length_p50, st.length_p90, st.length_p99, st.length_max);
    }
    pl_source_free(src);
    return EXIT_OK;
}

/* -------------------------------------------------------------- index */

static int cmd_index(int argc, char **argv) {
    args a;
    int code = parse_args(argc, argv, 2, "json", &a);
    if (code) return code;
    if (a.help) {
        fputs(usage_text, stdout);
        return EXIT_OK;
    }
    if (!a.positional) return usage_error("index: missing CONFIG");
    pl_config *cfg = NULL;
    code = load_config(a.positional, &cfg);
    if (code) return code;
    int rc = pl_config_set(cfg, "sidecar_index", "write");
    if (rc != PL_OK) {
        code = fail(EXIT_USAGE, pl_config_errmsg(cfg), rc);
        pl_config_free(cfg);
        return code;
    }
    int64_t n = pl_config_num_sources(cfg);
    if (a.json) fputs("{\"sources\": {", stdout);
    for (int64_t i = 0; i < n; i++) {
        pl_source *src = NULL;
        rc = pl_config_open_source(cfg, i, &src);
        if (rc != PL_OK) {
            if (a.json) fputs("}}\n", stdout);
            code = fail(rc == PL_ECONFIG ? EXIT_USAGE : EXIT_RUNTIME,
                        src ? pl_source_errmsg(src) : pl_last_errmsg(), rc);
            pl_source_free(src);
            pl_config_free(cfg);
            return code;
        }
        pl_source_type_row row;
        memset(&row, 0, sizeof row);
        row.size = sizeof row;
        pl_source_type_info(pl_source_get_type(src), &row); /* the source type table */
        const char *tname = row.name ? row.name : "?";
        const char *what = row.index ? row.index : "?";
        if (a.json) {
            if (i) fputs(", ", stdout);
            json_str(stdout, pl_config_source_name(cfg, i));
            fputs(": {\"type\": ", stdout);
            json_str(stdout, tname);
            printf(", \"files\": %" PRId64 ", \"documents\": %" PRId64 "}",
                   pl_source_num_files(src), pl_source_num_documents(src));
        } else {
            printf("%s (%s): %" PRId64 " files, %" PRId64 " documents, %s\n",
                   pl_config_source_name(cfg, i), tname, pl_source_num_files(src),
                   pl_source_num_documents(src), what);
        }
        pl_source_free(src);
    }
    if (a.json) fputs("}}\n", stdout);
    pl_config_free(cfg);
    return EXIT_OK;
}

/* ------------------------------------------------------------- keys */

/* The key table and the source types (pl_config_key_info,
 * pl_source_type_info), as text or as one JSON object. */
static int cmd_keys(int argc, char **argv) {
    args a;
    int code = parse_args(argc, argv, 2, "json", &a);
    if (code) return code;
    if (a.help) {
        fputs(usage_text, stdout);
        return EXIT_OK;
    }
    if (a.positional) return usage_error("keys: unexpected argument '%s'", a.positional);
    if (a.json) fputs("{\"keys\": [", stdout);
    for (int64_t i = 0; i < pl_config_key_count(); i++) {
        pl_config_key_row k;
        memset(&k, 0, sizeof k);
        k.size = sizeof k;
        if (pl_config_key_info(i, &k) != PL_OK) return fail(EXIT_RUNTIME, "key table", PL_EINVAL);
        char values[512] = "";
        size_t used = 0;
        for (int j = 0; k.values && k.values[j] && used < sizeof values; j++) {
            int w = snprintf(values + used, sizeof values - used, "%s%s", j ? ", " : "",
                             k.values[j]);
            if (w < 0) break;
            used += (size_t)w;
        }
        if (a.json) {
            fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", stdout);
            json_str(stdout, k.name);
            fputs(", \"type\": ", stdout);
            json_str(stdout, k.type);
            fputs(", \"default\": ", stdout);
            if (k.default_value)
                json_str(stdout, k.default_value);
            else
                fputs("null", stdout);
            if (k.min || k.max)
                printf(", \"min\": %" PRId64 ", \"max\": %" PRId64, k.min, k.max);
            if (k.values) {
                fputs(", \"values\": [", stdout);
                for (int j = 0; k.values[j]; j++) {
                    if (j) fputs(", ", stdout);
                    json_str(stdout, k.values[j]);
                }
                fputs("]", stdout);
            }
            printf(", \"settable\": %s, \"doc\": ", k.settable ? "true" : "false");
            json_str(stdout, k.doc);
            fputs("}", stdout);
        } else {
            printf("%-36s %-16s %-16s %s%s%s\n", k.name, k.type,
                   k.default_value ? k.default_value : "-", k.doc, k.values ? ": " : "",
                   values);
        }
    }
    if (a.json) fputs("\n], \"source_types\": [", stdout);
    else fputs("\nsource types:\n", stdout);
    for (int t = 1;; t++) {
        pl_source_type_row r;
        memset(&r, 0, sizeof r);
        r.size = sizeof r;
        if (pl_source_type_info((pl_source_type)t, &r) != PL_OK) break;
        if (a.json) {
            fputs(t > 1 ? ",\n  {\"name\": " : "\n  {\"name\": ", stdout);
            json_str(stdout, r.name);
            printf(", \"code\": %d, \"raw_text\": %s, \"index\": ", t,
                   r.raw_text ? "true" : "false");
            json_str(stdout, r.index);
            fputs(", \"doc\": ", stdout);
            json_str(stdout, r.doc);
            fputs("}", stdout);
        } else {
            printf("%-12s %s\n", r.name, r.doc);
        }
    }
    if (a.json) fputs("\n]}\n", stdout);
    return EXIT_OK;
}

/* ------------------------------------------------------------ calibrate */

/* Parse one CSV field as a finite double: strtod over [s, e) with
 * surrounding blanks allowed. */
static int parse_field(const char *s, const char *e, double *out) {
    while (s < e && (*s == ' ' || *s == '\t')) s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t')) e--;
    if (s == e || e - s >= 64) return 0;
    char buf[64];
    memcpy(buf, s, (size_t)(e - s));
    buf[e - s] = '\0';
    errno = 0;
    char *end = NULL;
    double v = strtod(buf, &end);
    if (errno || !end || *end || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

/* A row "tokens,sum_sq,step_time"; 1 if it parses. */
static int parse_row(const char *line, double v[3]) {
    const char *s = line;
    for (int k = 0; k < 3; k++) {
        const char *e = strchr(s, ',');
        if (k < 2 && !e) return 0;
        if (k == 2) {
            if (e) return 0;
            e = s + strlen(s);
        }
        if (!parse_field(s, e, &v[k])) return 0;
        s = e + 1;
    }
    return 1;
}

static int cmd_calibrate(int argc, char **argv) {
    args a;
    int code = parse_args(argc, argv, 2, "json", &a);
    if (code) return code;
    if (a.help) {
        fputs(usage_text, stdout);
        return EXIT_OK;
    }
    if (!a.positional) return usage_error("calibrate: missing CSV");
    void *data = NULL;
    size_t len = 0;
    if (read_file(a.positional, &data, &len) != 0) {
        fprintf(stderr, "polyload: error: cannot read '%s': %s\n",
                a.positional, strerror(errno));
        return EXIT_RUNTIME;
    }
    char *text = realloc(data, len + 1);
    if (!text) {
        free(data);
        return fail(EXIT_RUNTIME, NULL, PL_ENOMEM);
    }
    text[len] = '\0';
    int64_t n = 0, cap = 0, lineno = 0;
    double *col[3] = {NULL, NULL, NULL};
    int seen_row = 0;
    code = EXIT_OK;
    for (char *line = text; line && code == EXIT_OK;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        lineno++;
        size_t l = strlen(line);
        if (l && line[l - 1] == '\r') line[--l] = '\0';
        const char *t = line;
        while (*t == ' ' || *t == '\t') t++;
        double v[3];
        if (*t == '\0' || *t == '#') {
            /* blank line or comment */
        } else if (parse_row(t, v)) {
            if (n == cap) {
                int64_t nc = cap ? cap * 2 : 256;
                for (int k = 0; k < 3; k++) {
                    double *p = realloc(col[k], (size_t)nc * sizeof *p);
                    if (!p) {
                        code = fail(EXIT_RUNTIME, NULL, PL_ENOMEM);
                        break;
                    }
                    col[k] = p;
                }
                cap = nc;
            }
            if (code == EXIT_OK) {
                for (int k = 0; k < 3; k++) col[k][n] = v[k];
                n++;
            }
            seen_row = 1;
        } else if (!seen_row) {
            seen_row = 1; /* the header line */
        } else {
            fprintf(stderr,
                    "polyload: error: %s:%" PRId64 ": malformed row '%.80s' "
                    "(expected tokens,sum_sq,step_time)\n",
                    a.positional, lineno, t);
            code = EXIT_USAGE;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    double fa = 0, fb = 0, fc = 0, r2 = 0;
    if (code == EXIT_OK) {
        int rc = pl_cost_fit(col[0], col[1], col[2], n, &fa, &fb, &fc, &r2);
        if (rc != PL_OK) {
            fprintf(stderr,
                    "polyload: error: %s: cannot fit the cost model to %" PRId64
                    " rows (need at least 3, with tokens and sum_sq not "
                    "proportional)\n",
                    a.positional, n);
            code = EXIT_RUNTIME;
        }
    }
    for (int k = 0; k < 3; k++) free(col[k]);
    if (code != EXIT_OK) return code;
    if (a.json) {
        fputs("{\"a\": ", stdout);
        json_num(stdout, fa, 1);
        fputs(", \"b\": ", stdout);
        json_num(stdout, fb, 1);
        fputs(", \"c\": ", stdout);
        json_num(stdout, fc, 1);
        fputs(", \"r2\": ", stdout);
        json_num(stdout, r2, 1);
        printf(", \"rows\": %" PRId64 "}\n", n);
    } else {
        printf("time = a * tokens + b * sum_sq + c\n");
        printf("a                  %.6g\n", fa);
        printf("b                  %.6g\n", fb);
        printf("c                  %.6g\n", fc);
        printf("r2                 %.6f\n", r2);
        printf("rows               %" PRId64 "\n", n);
    }
    return EXIT_OK;
}

/* ------------------------------------------------------------ prepare */

static int cmd_prepare(int argc, char **argv) {
    char python[PATH_MAX + 64];
    const char *env = getenv("POLYLOAD_PYTHON");
    if (env && env[0]) {
        snprintf(python, sizeof python, "%s", env);
    } else {
        snprintf(python, sizeof python, "python3");
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
            exe[n] = '\0';
            char *slash = strrchr(exe, '/');
            if (slash) *slash = '\0';
            /* build/polyload -> ../.venv; build/x/polyload -> ../../.venv */
            static const char *const rel[] = {"/../.venv/bin/python",
                                              "/../../.venv/bin/python"};
            for (int i = 0; i < 2; i++) {
                char cand[PATH_MAX + 64];
                snprintf(cand, sizeof cand, "%s%s", exe, rel[i]);
                if (access(cand, X_OK) == 0) {
                    snprintf(python, sizeof python, "%s", cand);
                    break;
                }
            }
        }
    }
    char **av = calloc((size_t)argc + 3, sizeof *av);
    if (!av) return fail(EXIT_RUNTIME, NULL, PL_ENOMEM);
    int k = 0;
    av[k++] = python;
    av[k++] = "-m";
    if (strcmp(argv[1], "prepare") == 0) {
        av[k++] = "polyload.prepare";
    } else { /* check, report, serve, top: the package's own entry point */
        av[k++] = "polyload";
        av[k++] = argv[1];
    }
    for (int i = 2; i < argc; i++) av[k++] = argv[i];
    av[k] = NULL;
    fflush(NULL);
    execvp(python, av);
    fprintf(stderr, "polyload: error: cannot run '%s': %s\n", python,
            strerror(errno));
    free(av);
    return EXIT_RUNTIME;
}

/* ------------------------------------------------------------ main */

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("polyload %s\n", pl_version_string());
        return EXIT_OK;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 ||
        strcmp(cmd, "-h") == 0) {
        fputs(usage_text, stdout);
        return EXIT_OK;
    }
    if (strcmp(cmd, "run") == 0) return cmd_run(argc, argv);
    if (strcmp(cmd, "plan") == 0) return cmd_plan(argc, argv);
    if (strcmp(cmd, "inspect") == 0) return cmd_inspect(argc, argv);
    if (strcmp(cmd, "index") == 0) return cmd_index(argc, argv);
    if (strcmp(cmd, "keys") == 0) return cmd_keys(argc, argv);
    if (strcmp(cmd, "prepare") == 0 || strcmp(cmd, "check") == 0 ||
        strcmp(cmd, "report") == 0 || strcmp(cmd, "serve") == 0 || strcmp(cmd, "top") == 0)
        return cmd_prepare(argc, argv);
    if (strcmp(cmd, "calibrate") == 0) return cmd_calibrate(argc, argv);
    return usage_error("unknown command '%s'", cmd);
}
