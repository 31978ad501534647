/*
 * test_cli.c -- the `polyload` command line tool (SPEC section 6), run as a
 * child process on fixture data: exit codes (2 for usage and config errors,
 * 1 for data errors), `plan --json` lines that parse and come in (step,
 * dp_rank) order, `inspect --json` numbers equal to the fixture's, and `run`
 * with a state round trip.
 */
#include "fixtures.h"
#include "testutil.h"

#include <ctype.h>
#include <stdarg.h>
#include <sys/wait.h>

static char g_dir[256];

/* ------------------------------------------------------------ tiny JSON */

/* A syntax check of one JSON value (RFC 8259, without \u validation). */
static const char *js_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

static const char *js_value(const char *p, int depth);

static const char *js_string(const char *p) {
    if (*p != '"') return NULL;
    for (p++; *p && *p != '"'; p++) {
        if ((unsigned char)*p < 0x20) return NULL;
        if (*p == '\\') {
            p++;
            if (!*p || !strchr("\"\\/bfnrtu", *p)) return NULL;
        }
    }
    return *p == '"' ? p + 1 : NULL;
}

static const char *js_number(const char *p) {
    const char *s = p;
    if (*p == '-') p++;
    if (!isdigit((unsigned char)*p)) return NULL;
    while (isdigit((unsigned char)*p)) p++;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) return NULL;
        while (isdigit((unsigned char)*p)) p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!isdigit((unsigned char)*p)) return NULL;
        while (isdigit((unsigned char)*p)) p++;
    }
    return p > s ? p : NULL;
}

static const char *js_value(const char *p, int depth) {
    if (depth > 64) return NULL;
    p = js_ws(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        int obj = *p == '{';
        p = js_ws(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (obj) {
                p = js_string(js_ws(p));
                if (!p) return NULL;
                p = js_ws(p);
                if (*p++ != ':') return NULL;
            }
            p = js_value(p, depth + 1);
            if (!p) return NULL;
            p = js_ws(p);
            if (*p == ',') {
                p++;
                continue;
            }
            return *p == close ? p + 1 : NULL;
        }
    }
    if (*p == '"') return js_string(p);
    if (strncmp(p, "true", 4) == 0) return p + 4;
    if (strncmp(p, "false", 5) == 0) return p + 5;
    if (strncmp(p, "null", 4) == 0) return p + 4;
    return js_number(p);
}

static int json_valid(const char *s) {
    const char *end = js_value(s, 0);
    return end && *js_ws(end) == '\0';
}

/* The integer after "key": in s (first occurrence); -1 if absent. */
static int64_t json_int(const char *s, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(s, pat);
    if (!p) return -1;
    return strtoll(p + strlen(pat), NULL, 10);
}

/* ------------------------------------------------------------ running */

typedef struct result {
    int code;
    char out[1 << 17];
    char err[4096];
} result;

static result g_res;

/* Run `polyload ARGS` (a shell fragment); capture stdout and stderr. */
static result *cli(const char *fmt, ...) {
    char args[2048], cmd[4096], errpath[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", g_dir);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s 2>'%s' </dev/null", g_dir,
             PL_CLI_PATH, args, errpath);
    memset(&g_res, 0, sizeof g_res);
    FILE *p = popen(cmd, "r");
    if (!p) {
        g_res.code = -1;
        return &g_res;
    }
    size_t n = fread(g_res.out, 1, sizeof g_res.out - 1, p);
    g_res.out[n] = '\0';
    int st = pclose(p);
    g_res.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    FILE *e = fopen(errpath, "r");
    if (e) {
        n = fread(g_res.err, 1, sizeof g_res.err - 1, e);
        g_res.err[n] = '\0';
        fclose(e);
    }
    return &g_res;
}

#define CHECK_CODE(r, want)                                                  \
    do {                                                                     \
        pl_test_checks++;                                                    \
        if ((r)->code != (want)) {                                           \
            fprintf(stderr, "%s:%d: exit %d, expected %d\nstderr: %s\n",     \
                    __FILE__, __LINE__, (r)->code, (want), (r)->err);        \
            pl_test_failures++;                                              \
        }                                                                    \
    } while (0)

static void write_text(const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    if (pl_test_write_file(p, text, strlen(text)) != 0) {
        perror(p);
        exit(2);
    }
}

/* ------------------------------------------------------------ fixtures */

#define N_DOCS 40
static int64_t g_lengths[N_DOCS];
static int64_t g_tokens;

static void make_fixtures(void) {
    char p[512];
    g_tokens = 0;
    for (int i = 0; i < N_DOCS; i++) {
        g_lengths[i] = 3 + (i * 37) % 61; /* 3 .. 63 */
        g_tokens += g_lengths[i];
    }
    snprintf(p, sizeof p, "%s/web", g_dir);
    CHECK(plf_write_megatron(p, PL_DTYPE_UINT16, N_DOCS, g_lengths, 1) == 0);
    int64_t short_lengths[5] = {4, 8, 2, 9, 5};
    snprintf(p, sizeof p, "%s/wiki", g_dir);
    CHECK(plf_write_megatron(p, PL_DTYPE_INT32, 5, short_lengths, 0) == 0);
    /* A copy of web whose .idx has a bad magic. */
    snprintf(p, sizeof p, "%s/bad", g_dir);
    CHECK(plf_write_megatron(p, PL_DTYPE_UINT16, N_DOCS, g_lengths, 1) == 0);
    snprintf(p, sizeof p, "%s/bad.idx", g_dir);
    CHECK(plf_patch(p, 0, "XXIDIDX", 7) == 0);

    write_text("good.yaml", "seq_length: 64\n"
                            "global_batch_size: 8\n"
                            "micro_batch_size: 2\n"
                            "train_steps: 6\n"
                            "topology: {dp: 2, tp: 2, pp: 2}\n"
                            "threads: 2\n"
                            "sources:\n"
                            "  - {name: web, type: megatron, path: web, "
                            "weight: 3}\n"
                            "  - {name: wiki, type: megatron, path: wiki, "
                            "weight: 1}\n");
    write_text("endless.yaml", "seq_length: 64\n"
                               "global_batch_size: 4\n"
                               "sources:\n"
                               "  - {name: web, type: megatron, path: web}\n");
    write_text("typo.yaml", "seq_length: 64\n"
                            "global_bach_size: 4\n"
                            "sources:\n"
                            "  - {name: web, type: megatron, path: web}\n");
    write_text("nopath.yaml", "sources:\n"
                              "  - {name: web, type: megatron, path: nope}\n");
    write_text("corrupt.yaml", "seq_length: 64\n"
                               "global_batch_size: 4\n"
                               "train_steps: 2\n"
                               "sources:\n"
                               "  - {name: bad, type: megatron, path: bad}\n");
}

/* ------------------------------------------------------------ tests */

static void test_usage(void) {
    result *r = cli("--version");
    CHECK_CODE(r, 0);
    CHECK(strstr(r->out, pl_version_string()) != NULL);
    r = cli("help");
    CHECK_CODE(r, 0);
    CHECK(strstr(r->out, "usage: polyload") != NULL);
    r = cli("");
    CHECK_CODE(r, 2);
    r = cli("frobnicate");
    CHECK_CODE(r, 2);
    CHECK(strstr(r->err, "unknown command") != NULL);
    r = cli("run good.yaml --bogus");
    CHECK_CODE(r, 2);
    CHECK(strstr(r->err, "unknown option '--bogus'") != NULL);
    r = cli("run");
    CHECK_CODE(r, 2);
    r = cli("run good.yaml --steps");
    CHECK_CODE(r, 2);
    r = cli("run good.yaml --steps x");
    CHECK_CODE(r, 2);
    r = cli("plan good.yaml --json");
    CHECK_CODE(r, 2); /* --steps is required */
    r = cli("plan good.yaml --steps 3:1 --json");
    CHECK_CODE(r, 2);
    r = cli("plan good.yaml --steps 0:1 --rank 8 --json");
    CHECK_CODE(r, 2);
    r = cli("inspect web --type parquet");
    CHECK_CODE(r, 2);
    r = cli("run endless.yaml");
    CHECK_CODE(r, 2);
    CHECK(strstr(r->err, "--steps") != NULL);
}

static void test_config_errors(void) {
    result *r = cli("run typo.yaml --steps 1");
    CHECK_CODE(r, 2);
    CHECK(strstr(r->err, "polyload: error: typo.yaml:2: unknown key "
                         "'global_bach_size'") != NULL);
    r = cli("plan typo.yaml --steps 0:1 --json");
    CHECK_CODE(r, 2);
    r = cli("run nopath.yaml --steps 1");
    CHECK_CODE(r, 2);
    CHECK(strstr(r->err, "source 'web'") != NULL);
    r = cli("run missing.yaml --steps 1");
    CHECK_CODE(r, 2);
    CHECK(strstr(r->err, "missing.yaml") != NULL);
}

static void test_data_errors(void) {
    result *r = cli("run corrupt.yaml --no-progress");
    CHECK_CODE(r, 1);
    CHECK(strstr(r->err, "polyload: error: ") != NULL);
    CHECK(strstr(r->err, "bad") != NULL);
    r = cli("plan corrupt.yaml --steps 0:1 --json");
    CHECK_CODE(r, 1);
    r = cli("inspect bad.idx --json");
    CHECK_CODE(r, 1);
    CHECK(strstr(r->err, "polyload: error: ") != NULL);
    r = cli("run good.yaml --steps 1 --state-out /nonexistent-dir/state.bin");
    CHECK_CODE(r, 2);
    CHECK(strstr(r->err, "state-out") != NULL);
    r = cli("inspect does_not_exist.bin");
    CHECK_CODE(r, 1);
}

static void test_inspect(void) {
    int64_t sorted[N_DOCS];
    memcpy(sorted, g_lengths, sizeof sorted);
    int64_t mx = 0;
    for (int i = 0; i < N_DOCS; i++)
        if (sorted[i] > mx) mx = sorted[i];
    const char *forms[] = {"web", "web.idx", "web.bin", "web --type megatron",
                           "'we?'", "'w?b.idx'"};
    for (int k = 0; k < 6; k++) {
        result *r = cli("inspect %s --json", forms[k]);
        CHECK_CODE(r, 0);
        CHECK(json_valid(r->out));
        CHECK(strstr(r->out, "\"type\": \"megatron\"") != NULL);
        CHECK(strstr(r->out, "\"token_dtype\": \"uint16\"") != NULL);
        CHECK_EQ_I64(json_int(r->out, "files"), 1);
        CHECK_EQ_I64(json_int(r->out, "documents"), N_DOCS);
        CHECK_EQ_I64(json_int(r->out, "tokens"), g_tokens);
        CHECK_EQ_I64(json_int(r->out, "max"), mx);
        int64_t p50 = json_int(r->out, "p50");
        CHECK(p50 >= 3 && p50 <= mx);
    }
    result *r = cli("inspect wiki.idx --json");
    CHECK_CODE(r, 0);
    CHECK_EQ_I64(json_int(r->out, "documents"), 5);
    CHECK_EQ_I64(json_int(r->out, "tokens"), 28);
    CHECK(strstr(r->out, "\"token_dtype\": \"int32\"") != NULL);
    /* A uint32 flat file: two documents ending at eos 0. */
    {
        uint32_t toks[7] = {5, 6, 7, 0, 8, 9, 0};
        char fp[512];
        snprintf(fp, sizeof fp, "%s/f32.bin", g_dir);
        CHECK(pl_test_write_file(fp, toks, sizeof toks) == 0);
        r = cli("inspect f32.bin --json --token-dtype uint32 --eos-id 0");
        CHECK_CODE(r, 0);
        CHECK_EQ_I64(json_int(r->out, "documents"), 2);
        CHECK_EQ_I64(json_int(r->out, "tokens"), 7);
        r = cli("inspect f32.bin --token-dtype uint8");
        CHECK_CODE(r, 2);
        /* inspect writes no sidecar; `polyload index` does. */
        char ip[600];
        snprintf(ip, sizeof ip, "%s.plidx", fp);
        CHECK(access(ip, F_OK) != 0);
        write_text("f32.yaml", "seq_length: 8\nglobal_batch_size: 2\nmicro_batch_size: 1\n"
                               "sources:\n"
                               "  - {name: f, type: flat, path: f32.bin, token_dtype: uint32}\n"
                               "  - {name: w, type: megatron, path: wiki}\n");
        r = cli("index f32.yaml --json");
        CHECK_CODE(r, 0);
        CHECK(strstr(r->out, "{\"sources\": {\"f\": {\"type\": \"flat\", \"files\": 1, "
                             "\"documents\": 2}, \"w\": {\"type\": \"megatron\"") != NULL);
        CHECK(access(ip, F_OK) == 0);
        r = cli("index f32.yaml");
        CHECK_CODE(r, 0);
        CHECK(strstr(r->out, "f (flat): 1 files, 2 documents") != NULL);
        r = cli("index");
        CHECK_CODE(r, 2);
        /* Every source type is named, with what the index leaves for it. */
        write_text("d.jsonl", "{\"text\": \"ab\"}\n{\"text\": \"cd\"}\n");
        write_text("d.txt", "one document\n");
        write_text("raw.yaml", "seq_length: 8\nglobal_batch_size: 2\nmicro_batch_size: 1\n"
                               "tokenizer: {type: bytes}\n"
                               "sources:\n"
                               "  - {name: f, type: flat, path: f32.bin, token_dtype: uint32}\n"
                               "  - {name: j, type: jsonl, path: d.jsonl}\n"
                               "  - {name: t, type: text, path: d.txt}\n");
        r = cli("index raw.yaml");
        CHECK_CODE(r, 0);
        CHECK(strstr(r->out, "f (flat): 1 files, 2 documents, .plidx written or current") != NULL);
        CHECK(strstr(r->out, "j (jsonl): 1 files, 2 documents, no index file") != NULL);
        CHECK(strstr(r->out, "t (text): 1 files, 1 documents, no index file") != NULL);
        CHECK(strstr(r->out, "?") == NULL);
        r = cli("index raw.yaml --json");
        CHECK_CODE(r, 0);
        CHECK(json_valid(r->out));
        CHECK(strstr(r->out, "\"j\": {\"type\": \"jsonl\", \"files\": 1, \"documents\": 2}") != NULL);
    }
    /* The key table. */
    {
        result *k = cli("keys --json");
        CHECK_CODE(k, 0);
        CHECK(json_valid(k->out));
        CHECK(strstr(k->out, "{\"name\": \"seq_length\", \"type\": \"integer\", "
                             "\"default\": \"8192\", \"min\": 1, \"max\": 2147483647") != NULL);
        CHECK(strstr(k->out, "{\"name\": \"parquet\", \"code\": 7, \"raw_text\": true") != NULL);
        k = cli("keys");
        CHECK_CODE(k, 0);
        CHECK(strstr(k->out, "sources[].image.token_id") != NULL);
        k = cli("keys extra");
        CHECK_CODE(k, 2);
    }
    r = cli("inspect web");
    CHECK_CODE(r, 0);
    CHECK(strstr(r->out, "documents") != NULL);
}

/* Check `plan` output: lines in (step, dp_rank) order, valid JSON, each
 * sequence's cu_seqlens ending at seq_length.  Returns the line count. */
static int check_plan_lines(const char *out, int64_t first_step, int dp,
                            int64_t n_seq_per_rank) {
    int lines = 0;
    const char *p = out;
    while (*p) {
        const char *nl = strchr(p, '\n');
        if (!nl) {
            CHECK(!"unterminated line");
            break;
        }
        char line[1 << 15];
        size_t len = (size_t)(nl - p);
        CHECK(len < sizeof line);
        if (len >= sizeof line) break;
        memcpy(line, p, len);
        line[len] = '\0';
        CHECK(json_valid(line));
        CHECK(strncmp(line, "{\"step\": ", 9) == 0);
        CHECK_EQ_I64(json_int(line, "step"), first_step + lines / dp);
        CHECK_EQ_I64(json_int(line, "dp_rank"), lines % dp);
        CHECK(strstr(line, "\"rank_cost\": ") != NULL);
        /* Count sequences and check their cu_seqlens end at 64. */
        int64_t nseq = 0;
        for (const char *q = strstr(line, "\"micro_batch\": "); q;
             q = strstr(q + 1, "\"micro_batch\": "))
            nseq++;
        CHECK_EQ_I64(nseq, n_seq_per_rank);
        for (const char *q = strstr(line, "\"cu_seqlens\": [0"); q;
             q = strstr(q + 1, "\"cu_seqlens\": [0")) {
            const char *end = strchr(q, ']');
            const char *last = end;
            while (last > q && last[-1] != ' ') last--;
            CHECK_EQ_I64(strtoll(last, NULL, 10), 64);
        }
        lines++;
        p = nl + 1;
    }
    return lines;
}

static void test_plan(void) {
    result *r = cli("plan good.yaml --steps 1:4 --json");
    CHECK_CODE(r, 0);
    /* 3 steps x 2 DP ranks, 8 / 2 = 4 sequences each. */
    CHECK_EQ_I64(check_plan_lines(r->out, 1, 2, 4), 6);
    CHECK(strstr(r->out, "[\"web\", ") != NULL);
    char all[sizeof g_res.out];
    snprintf(all, sizeof all, "%s", r->out);

    /* Planning is deterministic. */
    r = cli("plan good.yaml --steps 1:4 --json");
    CHECK(strcmp(all, r->out) == 0);

    /* An empty range prints nothing. */
    r = cli("plan good.yaml --steps 2:2 --json");
    CHECK_CODE(r, 0);
    CHECK(r->out[0] == '\0');

    /* --rank 6 under tp-cp-ep-dp-pp with tp=2, dp=2, pp=2: tp 0, dp 1,
     * pp 1 (last stage). Its lines are dp rank 1's. */
    r = cli("plan good.yaml --steps 1:4 --rank 6 --json");
    CHECK_CODE(r, 0);
    int lines = 0;
    for (const char *q = r->out; (q = strchr(q, '\n')); q++) lines++;
    CHECK_EQ_I64(lines, 3);
    CHECK(strstr(r->out, "\"dp_rank\": 1, \"pp_rank\": 1, \"cp_rank\": 0, "
                         "\"tp_rank\": 0, \"fields\": [\"labels\", "
                         "\"loss_mask\", \"cu_seqlens\", \"max_seqlen\"]") !=
          NULL);
    /* Same sequences as dp rank 1 in the full output. */
    const char *seq_r = strstr(r->out, "\"sequences\"");
    const char *line1 = strchr(all, '\n') + 1; /* step 1, dp 1 */
    const char *seq_a = strstr(line1, "\"sequences\"");
    CHECK(seq_r && seq_a);
    if (seq_r && seq_a) {
        size_t n = (size_t)(strchr(seq_a, '\n') - seq_a);
        CHECK(strncmp(seq_r, seq_a, n) == 0);
    }
    r = cli("plan good.yaml --steps 0:1 --rank 1 --json");
    CHECK_CODE(r, 0);
    CHECK(strstr(r->out, "\"fields\": [\"input_ids\", \"position_ids\", "
                         "\"cu_seqlens\", \"max_seqlen\"]") != NULL);
}

static void test_run(void) {
    result *r = cli("run good.yaml --json --no-progress");
    CHECK_CODE(r, 0);
    CHECK(json_valid(r->out));
    CHECK_EQ_I64(json_int(r->out, "steps"), 6);
    CHECK(json_int(r->out, "tokens") > 0);
    CHECK(strstr(r->out, "\"sources\": {\"web\": {\"documents\": ") != NULL);
    CHECK(strstr(r->out, "\"wiki\": {\"documents\": ") != NULL);
    CHECK(strstr(r->out, "\"imbalance\": {\"max_over_mean\": ") != NULL);

    r = cli("run good.yaml --steps 2 --threads 1 --state-out st.bin "
            "--no-progress");
    CHECK_CODE(r, 0);
    CHECK(strstr(r->out, "steps") != NULL);
    r = cli("run good.yaml --steps 2 --json --state-in st.bin --no-progress");
    CHECK_CODE(r, 0);
    CHECK_EQ_I64(json_int(r->out, "steps"), 2);

    /* The state's step is absolute: plan 2:4 after it equals plan 2:4. */
    r = cli("plan good.yaml --steps 2:4 --json");
    CHECK_CODE(r, 0);
    char fresh[sizeof g_res.out];
    snprintf(fresh, sizeof fresh, "%s", r->out);
    r = cli("plan good.yaml --steps 2:4 --state-in st.bin --json");
    CHECK_CODE(r, 0);
    CHECK(strcmp(fresh, r->out) == 0);
    /* A state past the range start is a usage error. */
    r = cli("plan good.yaml --steps 1:4 --state-in st.bin --json");
    CHECK_CODE(r, 2);

    /* After train_steps the loader is done: 0 more steps. */
    r = cli("run good.yaml --steps 100 --json --no-progress");
    CHECK_CODE(r, 0);
    CHECK_EQ_I64(json_int(r->out, "steps"), 6);

    r = cli("run good.yaml --json --state-in nothere.bin");
    CHECK_CODE(r, 1);
}

/* Warnings go to stderr; dp: auto follows $WORLD_SIZE; text is not tokens. */
static void test_checks(void) {
    result *r = cli("plan good.yaml --steps 0:1 --json");
    CHECK_CODE(r, 0);
    CHECK(strstr(r->err, "polyload: warning: good.yaml:7: weights of sources "
                         "sum to 4, not 1: they are normalized to web 0.75, "
                         "wiki 0.25") != NULL);
    r = cli("plan endless.yaml --steps 0:1 --json");
    CHECK_CODE(r, 0);
    CHECK(strstr(r->err, "warning") == NULL);

    write_text("auto.yaml", "seq_length: 64\n"
                            "global_batch_size: 8\n"
                            "topology: {dp: auto, tp: 2, order: tp-dp}\n"
                            "sources:\n"
                            "  - {name: web, type: megatron, path: web}\n");
    setenv("WORLD_SIZE", "8", 1);
    r = cli("plan auto.yaml --steps 0:1 --json");
    CHECK_CODE(r, 0);
    CHECK(check_plan_lines(r->out, 0, 4, 2) == 4); /* dp = 8 / tp */
    setenv("WORLD_SIZE", "3", 1);
    r = cli("plan auto.yaml --steps 0:1 --json");
    CHECK_CODE(r, 2);
    CHECK(strstr(r->err, "world size 3 is not divisible by pp*cp*tp = 1*1*2") != NULL);
    setenv("WORLD_SIZE", "x", 1);
    r = cli("plan auto.yaml --steps 0:1 --json");
    CHECK_CODE(r, 2);
    CHECK(strstr(r->err, "WORLD_SIZE='x'") != NULL);
    unsetenv("WORLD_SIZE");
    r = cli("plan good.yaml --steps 0:1 --rank 8 --json");
    CHECK_CODE(r, 2);
    CHECK(strstr(r->err, "got '8' (topology dp=2 pp=2 cp=1 tp=2; WORLD_SIZE not set)") != NULL);
    r = cli("plan auto.yaml --steps 0:1 --json");
    CHECK_CODE(r, 0);
    CHECK(check_plan_lines(r->out, 0, 1, 8) == 1);

    /* A YAML file read as a flat token file is an error naming what it is. */
    r = cli("inspect good.yaml --json");
    CHECK_CODE(r, 1);
    CHECK(strstr(r->err, "good.yaml: the file holds text (or YAML), not uint16 "
                         "tokens: it starts with \"seq_length: 64 global_batch_size\"") != NULL);
    write_text("flat_text.yaml", "seq_length: 64\n"
                                 "global_batch_size: 4\n"
                                 "sources:\n"
                                 "  - {name: t, type: flat, path: good.yaml}\n");
    r = cli("run flat_text.yaml --steps 1 --no-progress");
    CHECK_CODE(r, 1);
    CHECK(strstr(r->err, "holds text (or YAML)") != NULL);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s", pl_test_tmpdir());
    make_fixtures();
    test_usage();
    test_config_errors();
    test_data_errors();
    test_inspect();
    test_plan();
    test_run();
    test_checks();
    TEST_END();
}
