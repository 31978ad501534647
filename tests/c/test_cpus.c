/*
 * test_cpus.c -- `threads: auto`: the CPUs of an affinity mask under a cgroup
 * quota (common/cpus.c, pure functions of their inputs), the count this
 * process gets (pl_cpus_available against its own sched_getaffinity, here and
 * in a child pinned to one CPU), and the config keys that take `auto`.
 */
#include "config/config.h"
#include "testutil.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_cpu_max(void) {
    CHECK_EQ_I64(pl__cpu_max_parse("max 100000\n"), 0);
    CHECK_EQ_I64(pl__cpu_max_parse("max"), 0);
    CHECK_EQ_I64(pl__cpu_max_parse("200000 100000\n"), 2);
    CHECK_EQ_I64(pl__cpu_max_parse("150000 100000\n"), 2); /* 1.5 CPUs: 2 threads */
    CHECK_EQ_I64(pl__cpu_max_parse("50000 100000"), 1);
    CHECK_EQ_I64(pl__cpu_max_parse("1000 100000"), 1);
    CHECK_EQ_I64(pl__cpu_max_parse("1600000 100000"), 16);
    CHECK_EQ_I64(pl__cpu_max_parse("400000 50000"), 8);
    CHECK_EQ_I64(pl__cpu_max_parse("300000"), 3); /* period defaults to 100 ms */
    CHECK_EQ_I64(pl__cpu_max_parse(""), 0);
    CHECK_EQ_I64(pl__cpu_max_parse("junk 100000"), 0);
    CHECK_EQ_I64(pl__cpu_max_parse("-1 100000"), 0);
    CHECK_EQ_I64(pl__cpu_max_parse(NULL), 0);
}

static void test_cpus_from(void) {
    CHECK_EQ_I64(pl__cpus_from(16, 0), 16);  /* no quota */
    CHECK_EQ_I64(pl__cpus_from(16, 4), 4);   /* quota tighter than the mask */
    CHECK_EQ_I64(pl__cpus_from(2, 8), 2);    /* mask tighter than the quota */
    CHECK_EQ_I64(pl__cpus_from(0, 0), 1);    /* unknown: one */
    CHECK_EQ_I64(pl__cpus_from(64, pl__cpu_max_parse("250000 100000")), 3);
    /* auto: less the reserve, at least one */
    CHECK_EQ_I64(pl__threads_auto(16, 1), 15);
    CHECK_EQ_I64(pl__threads_auto(2, 1), 1);
    CHECK_EQ_I64(pl__threads_auto(1, 1), 1);
    CHECK_EQ_I64(pl__threads_auto(pl__cpus_from(16, 4), 1), 3);
}

/* This process: never more than its affinity mask; a child pinned to one
 * CPU sees one. */
static void test_this_process(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CHECK_OK(sched_getaffinity(0, sizeof set, &set));
    int mask = CPU_COUNT(&set);
    int n = pl_cpus_available();
    CHECK(n >= 1 && n <= mask);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &set)) first = c;
    pid_t pid = fork();
    if (pid == 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(first, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0) _exit(3);
        _exit(pl_cpus_available() == 1 ? 0 : 4);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* A worker past the CPUs lowers its own priority, and no other thread's. */
static void *yield_thread(void *arg) {
    int *out = arg;
    pl__thread_yield_priority();
    out[0] = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    return NULL;
}

static void test_yield_priority(void) {
    int before = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    int got[1] = {-100};
    pthread_t t;
    CHECK_OK(pthread_create(&t, NULL, yield_thread, got));
    pthread_join(t, NULL);
    CHECK_EQ_I64(got[0], before > PL__YIELD_NICE ? before : PL__YIELD_NICE);
    CHECK_EQ_I64(getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid)), before);
}

static void test_config_auto(void) {
    const char *y = "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
                    "threads: auto\n"
                    "sources:\n"
                    "  - {name: a, type: jsonl, path: x, tokenizer: {type: bytes}}\n"
                    "  - {name: b, type: jsonl, path: x, tokenizer: {type: bytes, threads: auto}}\n"
                    "  - {name: c, type: jsonl, path: x, tokenizer: {type: bytes, threads: 3}}\n";
    pl_config *cfg = NULL;
    CHECK_OK(pl_config_parse_string(y, strlen(y), "t.yaml", &cfg));
    CHECK_EQ_I64(cfg->threads, 0);
    int64_t v = -1;
    CHECK_OK(pl_config_get_int(cfg, "threads", &v));
    CHECK_EQ_I64(v, 0);
    CHECK_EQ_I64(pl__sx(&cfg->sources[0])->tok.threads, 0); /* default: auto */
    CHECK_EQ_I64(pl__sx(&cfg->sources[1])->tok.threads, 0);
    CHECK_EQ_I64(pl__sx(&cfg->sources[2])->tok.threads, 3);
    CHECK_OK(pl_config_set(cfg, "threads", "5"));
    CHECK_EQ_I64(cfg->threads, 5);
    CHECK_OK(pl_config_set(cfg, "threads", "auto"));
    CHECK_EQ_I64(cfg->threads, 0);
    CHECK_EQ_I64(pl_config_set(cfg, "threads", "'auto'x"), PL_ECONFIG);
    CHECK_EQ_I64(pl_config_set(cfg, "threads", "-2"), PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "threads: expected auto or a positive") != NULL);
    pl_config_free(cfg);

    const char *bad[] = {
        "threads: 0\nsources:\n  - {name: a, type: jsonl, path: x, tokenizer: {type: bytes}}\n",
        "threads: many\nsources:\n  - {name: a, type: jsonl, path: x, tokenizer: {type: bytes}}\n",
        "sources:\n  - {name: a, type: jsonl, path: x, tokenizer: {type: bytes, threads: 0}}\n",
        "sources:\n  - {name: a, type: jsonl, path: x, tokenizer: {type: bytes, threads: 257}}\n",
        "sources:\n  - {name: a, type: jsonl, path: x, tokenizer: {type: bytes, threads: 'auto'}}\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg = NULL;
        CHECK_EQ_I64(pl_config_parse_string(bad[i], strlen(bad[i]), "t.yaml", &cfg), PL_ECONFIG);
        CHECK(strstr(pl_config_errmsg(cfg), "threads: expected auto or a positive") != NULL);
        CHECK(strstr(pl_config_errmsg(cfg), "t.yaml") != NULL);
        pl_config_free(cfg);
    }
}

int main(void) {
    test_cpu_max();
    test_cpus_from();
    test_this_process();
    test_yield_priority();
    test_config_auto();
    TEST_END();
}
