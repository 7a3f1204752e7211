/* Every service's HTTP face: the metrics registry's text (mqgrad/metrics.h), the shared HTTP
 * server (mqgrad/http.h) with its routes, token and errors, the services' --http-* flags, and
 * a real run whose every process serves /metrics while it trains. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "http_test.h"
#include "local_run.h"
#include "mqgrad/http.h"
#include "mqgrad/metrics.h"
#include "mqgrad/nn.h"
#include "mqgrad/util.h"

/* The registry's text, with room to spare: the process's CPU time may take a digit more on
 * the second render than on the first. */
static char *s_render(mq_metrics_t *m)
{
    size_t need = mq_metrics_render(m, NULL, 0);
    char *buf = malloc(need + 64);
    cr_assert_not_null(buf);
    cr_assert_lt(mq_metrics_render(m, buf, need + 64), need + 64);
    return buf;
}

/* ---- the registry ------------------------------------------------------------------- */

Test(metrics, text_format)
{
    mq_metrics_t *m = mq_metrics_new("worker");
    mq_metric_t *c = mq_metrics_counter(m, "t_requests_total", "Requests.", "code=\"200\"");
    mq_metric_t *c2 = mq_metrics_counter(m, "t_requests_total", "Requests.", "code=\"404\"");
    mq_metric_t *g = mq_metrics_gauge(m, "t_ratio", "A ratio.\nSecond line.", NULL);
    const double bounds[] = {0.1, 1};
    mq_metric_t *h = mq_metrics_histogram(m, "t_seconds", "Times.", "phase=\"compute\"", bounds, 2);
    cr_assert(c && c2 && g && h);
    cr_assert_eq(mq_metrics_counter(m, "t_requests_total", NULL, "code=\"200\""), c,
                 "the same name and labels give the same series");
    mq_metric_add(c, 3);
    mq_metric_add(c, -1); /* a counter never goes down */
    mq_metric_set(c, 2);
    mq_metric_add(c2, 1);
    mq_metric_set(g, NAN);
    mq_metric_observe(h, 0.05);
    mq_metric_observe(h, 0.5);
    mq_metric_observe(h, 7);
    cr_assert_float_eq(mq_metric_value(c), 3, 0);
    cr_assert_float_eq(mq_metric_value(h), 3, 0);
    char *text = s_render(m);
    cr_assert(strstr(text, "# HELP mqgrad_build_info"), "%s", text);
    cr_assert(strstr(text, "mqgrad_build_info{role=\"worker\",version=\""), "%s", text);
    cr_assert(strstr(text, "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds "),
              "%s", text);
    /* the process's CPU time and memory, as read when rendered: a loop of this thread's */
    const char *cpu = strstr(text, "# TYPE process_cpu_seconds_total counter\n"
                                   "process_cpu_seconds_total ");
    const char *rss = strstr(text, "# TYPE process_resident_memory_bytes gauge\n"
                                   "process_resident_memory_bytes ");
    cr_assert(cpu && rss, "%s", text);
    cr_expect_gt(strtod(strchr(rss, '\n') + strlen("process_resident_memory_bytes "), NULL), 1e6,
                 "a process holds more than 1 MB");
    volatile double spin = 0;
    double t0 = strtod(strchr(cpu, '\n') + strlen("process_cpu_seconds_total "), NULL);
    for (long i = 0; i < 50000000; i++)
        spin += 1e-9 * (double)i;
    free(text);
    text = s_render(m);
    cpu = strstr(text, "\nprocess_cpu_seconds_total ");
    cr_assert(cpu);
    cr_expect_gt(strtod(cpu + strlen("\nprocess_cpu_seconds_total "), NULL), t0 + 0.005,
                 "50M additions took no CPU time (%.0f)", spin);
    cr_assert(strstr(text, "# HELP t_requests_total Requests.\n# TYPE t_requests_total counter\n"
                           "t_requests_total{code=\"200\"} 3\nt_requests_total{code=\"404\"} 1\n"),
              "%s", text);
    cr_assert(strstr(text, "# HELP t_ratio A ratio. Second line.\n# TYPE t_ratio gauge\n"
                           "t_ratio NaN\n"),
              "%s", text);
    cr_assert(strstr(text, "# TYPE t_seconds histogram\n"
                           "t_seconds_bucket{phase=\"compute\",le=\"0.1\"} 1\n"
                           "t_seconds_bucket{phase=\"compute\",le=\"1\"} 2\n"
                           "t_seconds_bucket{phase=\"compute\",le=\"+Inf\"} 3\n"
                           "t_seconds_sum{phase=\"compute\"} 7.5499999999999998\n"
                           "t_seconds_count{phase=\"compute\"} 3\n"),
              "%s", text);
    free(text);
    /* an info metric changes its label; a truncating render still says what it needs */
    mq_metric_t *info = mq_metrics_gauge(m, "t_policy_info", "Policy.", "policy=\"a\"");
    mq_metric_set(info, 1);
    char esc[64];
    char labels[96];
    snprintf(labels, sizeof labels, "policy=\"%s\"", mq_metrics_escape(esc, sizeof esc, "b\"\\\n"));
    cr_assert_eq(mq_metric_relabel(info, labels), 0);
    text = s_render(m);
    cr_assert(strstr(text, "t_policy_info{policy=\"b\\\"\\\\\\n\"} 1\n"), "%s", text);
    cr_assert_null(strstr(text, "policy=\"a\""));
    char small[16];
    /* the whole text's length, as snprintf says it (the CPU time's and memory's digits vary) */
    size_t need = mq_metrics_render(m, small, sizeof small);
    cr_assert(need + 40 >= strlen(text) && need <= strlen(text) + 40, "%zu for %zu", need,
              strlen(text));
    cr_assert_eq(strlen(small), sizeof small - 1);
    free(text);
    mq_metrics_destroy(&m);
    cr_assert_null(m);
}

Test(metrics, bad_registrations)
{
    mq_metrics_t *m = mq_metrics_new("server");
    cr_assert_null(mq_metrics_gauge(m, "9lives", "", NULL));
    cr_assert(strstr(mq_err_last(), "not valid"), "%s", mq_err_last());
    cr_assert_null(mq_metrics_gauge(m, "has-dash", "", NULL));
    cr_assert_null(mq_metrics_gauge(m, "ok", "", "rank=3"));
    cr_assert_null(mq_metrics_gauge(m, "ok", "", "rank=\"3\","));
    cr_assert_null(mq_metrics_gauge(m, "ok", "", "rank=\"a\nb\""));
    cr_assert_not_null(mq_metrics_counter(m, "twice", "", NULL));
    cr_assert_null(mq_metrics_gauge(m, "twice", "", NULL));
    cr_assert(strstr(mq_err_last(), "another type"), "%s", mq_err_last());
    const double down[] = {2, 1};
    cr_assert_null(mq_metrics_histogram(m, "h", "", NULL, down, 2));
    cr_assert_null(mq_metrics_histogram(m, "h", "", NULL, down, 0));
    /* the registry's own series are not a caller's to write (a fuzzed gauge of that name
     * read back the process's memory) */
    cr_assert_null(mq_metrics_gauge(m, "process_resident_memory_bytes", "", NULL));
    cr_assert(strstr(mq_err_last(), "registry's own"), "%s", mq_err_last());
    cr_assert_null(mq_metrics_gauge(m, "mqgrad_build_info", "", "role=\"x\""));
    cr_assert_null(mq_metrics_counter(m, "process_cpu_seconds_total", "", NULL));
    /* NULL series are ignored by every update */
    mq_metric_add(NULL, 1);
    mq_metric_set(NULL, 1);
    mq_metric_observe(NULL, 1);
    cr_assert(isnan(mq_metric_value(NULL)));
    mq_metrics_destroy(&m);
}

/* ---- the server --------------------------------------------------------------------- */

static size_t s_hello(void *arg, char *buf, size_t cap)
{
    return (size_t)snprintf(buf, cap, "{\"hello\":\"%s\"}", (const char *)arg);
}

Test(http, routes_token_errors)
{
    mq_metrics_t *m = mq_metrics_new("scheduler");
    mq_metric_set(mq_metrics_gauge(m, "t_iteration", "Iteration.", NULL), 42);
    mq_http_cfg_t cfg;
    mq_http_cfg_init(&cfg, MQ_HTTP_ANY_PORT);
    snprintf(cfg.bind, sizeof cfg.bind, "127.0.0.1");
    mq_http_route_t route = {"/hello", "application/json", s_hello, "world"};
    mq_http_t *h = mq_http_new(&cfg, m, &route, 1);
    cr_assert_not_null(h, "%s", mq_err_last());
    int port = mq_http_port(h);
    cr_assert_gt(port, 0);
    static char body[65536];
    cr_assert_eq(test_http(port, NULL, "GET", "/metrics", body, sizeof body), 200);
    cr_assert(strstr(body, "\nt_iteration 42\n"), "%s", body);
    cr_assert(strstr(body, "role=\"scheduler\""), "%s", body);
    cr_assert_eq(test_http(port, NULL, "GET", "/hello", body, sizeof body), 200);
    cr_assert_str_eq(body, "{\"hello\":\"world\"}\n");
    cr_assert_eq(test_http(port, NULL, "GET", "/healthz", body, sizeof body), 200);
    cr_assert_eq(test_http(port, NULL, "GET", "/nope", body, sizeof body), 404);
    cr_assert(strstr(body, "/metrics") && strstr(body, "/hello"), "%s", body);
    cr_assert_eq(test_http(port, NULL, "POST", "/metrics", body, sizeof body), 405);
    /* a second server cannot take the same port: a specific error, not a crash */
    mq_http_cfg_t again = cfg;
    again.port = port;
    cr_assert_null(mq_http_new(&again, m, NULL, 0));
    cr_assert(strstr(mq_err_last(), "cannot listen"), "%s", mq_err_last());
    mq_http_destroy(&h);
    cr_assert_null(h);

    /* with a token: /metrics and the routes need it, /healthz never does */
    char path[] = "/tmp/mqgrad-test-token-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "s3cret\nignored\n", 15), 15);
    close(fd);
    snprintf(cfg.token_file, sizeof cfg.token_file, "%s", path);
    cr_assert_eq(mq_http_cfg_resolve(&cfg), 0, "%s", mq_err_last());
    cr_assert_str_eq(cfg.token, "s3cret");
    h = mq_http_new(&cfg, m, &route, 1);
    cr_assert_not_null(h, "%s", mq_err_last());
    port = mq_http_port(h);
    cr_assert_eq(test_http(port, NULL, "GET", "/metrics", body, sizeof body), 401);
    cr_assert_eq(test_http(port, "wrong!", "GET", "/metrics", body, sizeof body), 401);
    cr_assert_eq(test_http(port, NULL, "GET", "/hello", body, sizeof body), 401);
    cr_assert_eq(test_http(port, "s3cret", "GET", "/metrics", body, sizeof body), 200);
    cr_assert_eq(test_http(port, NULL, "GET", "/healthz", body, sizeof body), 200);
    mq_http_destroy(&h);
    mq_metrics_destroy(&m);

    /* bad tokens and addresses */
    cr_assert_eq(write(fd = open(path, O_WRONLY | O_TRUNC), "\n", 1), 1);
    close(fd);
    cr_assert_eq(mq_http_cfg_resolve(&cfg), -1);
    cr_assert(strstr(mq_err_last(), "empty first line"), "%s", mq_err_last());
    unlink(path);
    cr_assert_eq(mq_http_cfg_resolve(&cfg), -1);
    cr_assert(strstr(mq_err_last(), "cannot read"), "%s", mq_err_last());
    mq_http_cfg_init(&cfg, MQ_HTTP_ANY_PORT);
    snprintf(cfg.token, sizeof cfg.token, "two words");
    cr_assert_eq(mq_http_cfg_resolve(&cfg), -1);
    cr_assert(strstr(mq_err_last(), "printable ASCII without spaces"), "%s", mq_err_last());
    mq_http_cfg_init(&cfg, MQ_HTTP_ANY_PORT);
    snprintf(cfg.bind, sizeof cfg.bind, "localhost");
    cr_assert_null(mq_http_new(&cfg, NULL, NULL, 0));
    cr_assert(strstr(mq_err_last(), "not an IP address"), "%s", mq_err_last());
}

/* ---- the services ------------------------------------------------------------------- */

/* Runs EXE with ARGS (NULL-terminated), its stderr into ERR; returns its exit code. */
static int s_run(const char *exe, const char *const *args, char *err, size_t cap)
{
    char path[] = "/tmp/mqgrad-test-stderr-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(fd, STDERR_FILENO);
        freopen("/dev/null", "w", stdout);
        setenv("MQGRAD_INSECURE", "1", 1);
        execv(exe, (char *const *)args);
        _exit(127);
    }
    close(fd);
    int code = test_wait(pid, 30);
    char *text;
    size_t len;
    cr_assert_eq(mq_read_file(path, &text, &len), 0);
    snprintf(err, cap, "%s", text);
    free(text);
    unlink(path);
    return code;
}

Test(http, service_flags)
{
    char err[2048];
    const char *roles[] = {"scheduler", "server", "worker", "agent"};
    for (int i = 0; i < 4; i++) {
        char exe[512];
        snprintf(exe, sizeof exe, "%s/services/mqgrad-%s", MQ_TEST_BIN_DIR, roles[i]);
        const char *range[] = {exe, "--http-port", "70000", NULL};
        cr_assert_eq(s_run(exe, range, err, sizeof err), 2, "%s", roles[i]);
        cr_assert(strstr(err, "http-port"), "%s: %s", roles[i], err);
        const char *missing[] = {exe, "--http-port", "1", "--http-token-file",
                                 "/nonexistent/token", NULL};
        cr_assert_eq(s_run(exe, missing, err, sizeof err), 2, "%s", roles[i]);
        cr_assert(strstr(err, "cannot read '/nonexistent/token'"), "%s: %s", roles[i], err);
        /* "--http-token $UNSET" must not quietly leave /metrics open */
        const char *empty[] = {exe, "--http-port", "1", "--http-token", "", NULL};
        cr_assert_eq(s_run(exe, empty, err, sizeof err), 2, "%s", roles[i]);
        cr_assert(strstr(err, "--http-token") && strstr(err, "must not be empty"), "%s: %s",
                  roles[i], err);
        const char *empty_file[] = {exe, "--http-port", "1", "--http-token-file=", NULL};
        cr_assert_eq(s_run(exe, empty_file, err, sizeof err), 2, "%s", roles[i]);
        cr_assert(strstr(err, "--http-token-file") && strstr(err, "must not be empty"), "%s: %s",
                  roles[i], err);
    }
}

/* A worker started by hand (no OPENBLAS_CORETYPE, no OPENBLAS_THREAD_TIMEOUT: it runs itself
 * again with the timeout where OpenBLAS would use more than one thread, and with a core type
 * where OpenBLAS chose Prescott) is still named mqgrad-worker, which is what ps, pgrep and the
 * e2e tests' crash helper look for, and runs with OpenBLAS's idle threads asleep. */
Test(http, a_service_keeps_its_name)
{
    char exe[512];
    snprintf(exe, sizeof exe, "%s/services/mqgrad-worker", MQ_TEST_BIN_DIR);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv(MQ_NN_BLAS_TIMEOUT_ENV);
        setenv("MQGRAD_INSECURE", "1", 1);
        execl(exe, exe, "--scheduler", "tcp://127.0.0.1:1", "--peer-timeout", "20", NULL);
        _exit(127);
    }
    char path[64], comm[64] = "", env[16384] = "";
    zclock_sleep(1500); /* long past a second start */
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(comm, sizeof comm, f))
            comm[0] = 0;
        fclose(f);
    }
    /* The environment the running program was started with: NUL-separated. */
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    size_t got = 0;
    if ((f = fopen(path, "r"))) {
        got = fread(env, 1, sizeof env - 1, f);
        fclose(f);
    }
    bool timeout = false;
    for (size_t at = 0; at < got; at += strlen(env + at) + 1)
        timeout |= strcmp(env + at, MQ_NN_BLAS_TIMEOUT_ENV "=" MQ_NN_BLAS_TIMEOUT) == 0;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    comm[strcspn(comm, "\n")] = 0;
    cr_assert_str_eq(comm, "mqgrad-worker");
    if (openblas_get_num_threads() > 1)
        cr_expect(timeout, "the worker did not run again with %s=%s", MQ_NN_BLAS_TIMEOUT_ENV,
                  MQ_NN_BLAS_TIMEOUT);
}

static bool s_cpu_has_avx2_fma(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

static pid_t s_run_pid;

/* A failed assertion leaves the test early: the run must not outlive it. */
static void s_stop_run(void)
{
    if (s_run_pid > 0 && waitpid(s_run_pid, NULL, WNOHANG) == 0) {
        kill(s_run_pid, SIGTERM);
        waitpid(s_run_pid, NULL, 0);
    }
}

/* A real run, every process serving /metrics: the scheduler's counts iterations as they
 * happen, and every target RUN/prometheus-targets.json lists answers as its role. */
Test(http, local_run_metrics, .timeout = 240, .fini = s_stop_run)
{
    char dir[128], port_s[16];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-test-%d-http", (int)getpid());
    /* a port nobody holds now */
    mq_http_cfg_t probe;
    mq_http_cfg_init(&probe, MQ_HTTP_ANY_PORT);
    mq_http_t *h = mq_http_new(&probe, NULL, NULL, 0);
    int port = mq_http_port(h);
    mq_http_destroy(&h);
    snprintf(port_s, sizeof port_s, "%d", port);
    /* long enough to be scraped mid-run; the time budget ends it on a slow machine (3000
     * iterations took about 200 s under AddressSanitizer on a 2-core Xeon, family 6 model 85) */
    const char *args[] = {"--model",       "small", "--iterations", "3000",
                          "--time-budget", "60",    "--eval-every", "500",
                          "--eval-limit",  "1000",  "--policy",     "fixed:4",
                          "--http-port",   port_s,  "--insecure",   NULL};
    pid_t pid = s_run_pid = test_spawn_args(dir, args);
    static char body[1 << 16];
    double first = NAN, later = NAN;
    for (int i = 0; i < 600 && !(later > first + 10); i++) {
        usleep(100000);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bool up = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
        if (!up || test_http(port, NULL, "GET", "/metrics", body, sizeof body) != 200)
            continue;
        double it = test_metric_sample(body, "mqgrad_scheduler_iterations_total ");
        if (isnan(first) && it >= 1)
            first = it;
        else if (!isnan(first))
            later = it;
    }
    cr_assert(later > first + 10, "the scheduler's iteration counter did not rise (%g, %g)",
              first, later);
    cr_assert_float_eq(test_metric_sample(body, "mqgrad_scheduler_members "), 2, 0, "%s", body);
    cr_assert_float_eq(test_metric_sample(body, "mqgrad_scheduler_servers "), 2, 0, "%s", body);
    cr_assert_float_eq(test_metric_sample(body, "mqgrad_scheduler_bits "), 4, 0, "%s", body);
    cr_assert_gt(test_metric_sample(body, "mqgrad_scheduler_pushed_bytes_total "), 0);
    cr_assert_gt(test_metric_sample(body, "mqgrad_scheduler_fp32_push_bytes "), 0);
    cr_assert(!isnan(test_metric_sample(
                  body, "mqgrad_scheduler_worker_seconds{rank=\"1\",phase=\"compute\"} ")),
              "%s", body);
    /* every target: its role, and its own count of the work */
    char *targets = test_slurp(dir, "prometheus-targets.json");
    int seen[4] = {0};
    const char *roles[] = {"scheduler", "server", "worker", "agent"};
    const char *work[] = {"mqgrad_scheduler_iterations_total ", "mqgrad_server_rounds_total ",
                          "mqgrad_worker_iterations_total ", "mqgrad_agent_observations_total "};
    for (const char *p = strstr(targets, "127.0.0.1:"); p; p = strstr(p + 1, "127.0.0.1:")) {
        int tport = atoi(p + 10);
        const char *r = strstr(p, "\"role\": \"");
        cr_assert_not_null(r);
        r += 9;
        int k = 0;
        while (k < 4 && strncmp(r, roles[k], strlen(roles[k])) != 0)
            k++;
        cr_assert_lt(k, 4, "%s", targets);
        cr_assert_eq(test_http(tport, NULL, "GET", "/metrics", body, sizeof body), 200);
        char info[96];
        snprintf(info, sizeof info, "mqgrad_build_info{role=\"%s\"", roles[k]);
        cr_assert(strstr(body, info), "%s at %d: %s", roles[k], tport, body);
        cr_assert_gt(test_metric_sample(body, work[k]), 0, "%s at %d: %s", roles[k], tport, body);
        if (k == 2) /* a worker computes with OpenBLAS's kernels for this CPU, not the generic
                     * ones it falls back to on a CPU newer than itself */
            cr_assert(strstr(body, "mqgrad_worker_blas_info{core=\"") &&
                          (!s_cpu_has_avx2_fma() ||
                           !strstr(body, "mqgrad_worker_blas_info{core=\"Prescott\"}")),
                      "worker at %d: %s", tport, body);
        seen[k]++;
    }
    cr_assert_eq(seen[0], 1, "%s", targets);
    cr_assert_eq(seen[1], 2, "%s", targets);
    cr_assert_eq(seen[2], 2, "%s", targets);
    cr_assert_eq(seen[3], 1, "%s", targets);
    free(targets);
    cr_assert_eq(test_wait(pid, 200), 0, "the run did not complete");
    s_run_pid = 0;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* A free TCP port on loopback, as the HTTP server finds one. */
static int s_free_port(void)
{
    mq_http_cfg_t cfg;
    mq_http_cfg_init(&cfg, MQ_HTTP_ANY_PORT);
    snprintf(cfg.bind, sizeof cfg.bind, "127.0.0.1");
    mq_http_t *h = mq_http_new(&cfg, NULL, NULL, 0);
    cr_assert_not_null(h, "%s", mq_err_last());
    int port = mq_http_port(h);
    mq_http_destroy(&h);
    return port;
}

static pid_t s_linger_pids[3];

static void s_stop_linger(void)
{
    for (int i = 0; i < 3; i++)
        if (s_linger_pids[i] > 0 && waitpid(s_linger_pids[i], NULL, WNOHANG) == 0) {
            kill(s_linger_pids[i], SIGKILL);
            waitpid(s_linger_pids[i], NULL, 0);
        }
}

/* Starts service EXE with ARGS (NULL-terminated), lingering, without keys, logging to LOG. */
static pid_t s_spawn_service(const char *exe, const char *const *args, const char *log)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        freopen(log, "w", stderr);
        freopen("/dev/null", "w", stdout);
        setenv("MQGRAD_INSECURE", "1", 1);
        setenv("MQGRAD_LINGER", "1", 1);
        execv(exe, (char *const *)args);
        _exit(127);
    }
    return pid;
}

/* MQGRAD_LINGER=1 (for orchestrators that restart whatever ends): after the run every service
 * stays up, answering probes and serving its metrics, instead of exiting to be restarted
 * into a new run; SIGTERM then ends each with 0. */
Test(http, lingering_services_stay_up_after_the_run, .timeout = 200, .fini = s_stop_linger)
{
    char dir[128], run[160], log[3][200], zport[16], sched_http[16], worker_http[16], ep[64];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-test-%d-linger", (int)getpid());
    snprintf(run, sizeof run, "%s/run", dir);
    cr_assert_eq(mq_mkdirs(dir), 0);
    snprintf(zport, sizeof zport, "%d", s_free_port());
    snprintf(sched_http, sizeof sched_http, "%d", s_free_port());
    snprintf(worker_http, sizeof worker_http, "%d", s_free_port());
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%s", zport);
    char bind[64], exe[3][256];
    snprintf(bind, sizeof bind, "tcp://127.0.0.1:%s", zport);
    const char *roles[3] = {"scheduler", "server", "worker"};
    for (int i = 0; i < 3; i++) {
        snprintf(exe[i], sizeof exe[i], "%s/services/mqgrad-%s", MQ_TEST_BIN_DIR, roles[i]);
        snprintf(log[i], sizeof log[i], "%s/%s.log", dir, roles[i]);
    }
    const char *sched[] = {exe[0], "--bind", bind, "--workers", "1", "--servers", "1",
                           "--model", "small", "--iterations", "20", "--eval-every", "0",
                           "--run-dir", run, "--progress-every", "0", "--http-port", sched_http,
                           "--http-bind", "127.0.0.1", NULL};
    const char *server[] = {exe[1], "--scheduler", ep, "--bind", "tcp://127.0.0.1:*", NULL};
    const char *worker[] = {exe[2], "--scheduler", ep, "--threads", "1", "--http-port",
                            worker_http, "--http-bind", "127.0.0.1", NULL};
    s_linger_pids[0] = s_spawn_service(exe[0], sched, log[0]);
    s_linger_pids[1] = s_spawn_service(exe[1], server, log[1]);
    s_linger_pids[2] = s_spawn_service(exe[2], worker, log[2]);
    char path[256];
    snprintf(path, sizeof path, "%s/summary.json", run);
    for (int i = 0; i < 1200 && access(path, F_OK) != 0; i++)
        usleep(100000);
    cr_assert_eq(access(path, F_OK), 0, "the run did not end within 120 s");
    char *summary = test_slurp(run, "summary.json");
    cr_assert(strstr(summary, "\"status\": \"completed\""), "%s", summary);
    free(summary);
    sleep(3); /* time enough to exit, were they to */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(waitpid(s_linger_pids[i], NULL, WNOHANG), 0, "the %s exited after the run",
                     roles[i]);
    static char body[1 << 16];
    cr_assert_eq(test_http(atoi(sched_http), NULL, "GET", "/metrics", body, sizeof body), 200);
    cr_assert_float_eq(test_metric_sample(body, "mqgrad_scheduler_iterations_total "), 20, 0, "%s",
                       body);
    cr_assert_eq(test_http(atoi(worker_http), NULL, "GET", "/healthz", body, sizeof body), 200);
    char err[1024];
    const char *probe[] = {MQGRAD, "probe", ep, "--service", "scheduler", NULL};
    cr_assert_eq(s_run(MQGRAD, probe, err, sizeof err), 0, "probe of a lingering scheduler: %s",
                 err);
    for (int i = 2; i >= 0; i--) {
        kill(s_linger_pids[i], SIGTERM);
        cr_assert_eq(test_wait(s_linger_pids[i], 20), 0, "the %s did not end cleanly on SIGTERM",
                     roles[i]);
        s_linger_pids[i] = 0;
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* A TCP connection to ADDR:PORT; -1 with errno if refused. */
static int s_connect(in_addr_t addr, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = addr;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

/* The local address of the listening TCP socket on PORT, from /proc/net/tcp (0 if none). */
static in_addr_t s_listening_addr(int port)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    unsigned addr = 0, p = 0, state = 0;
    in_addr_t found = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, " %*d: %8X:%4X %*8X:%*4X %2X", &addr, &p, &state) == 3 &&
            (int)p == port && state == 0x0A) /* LISTEN */
            found = (in_addr_t)addr ? (in_addr_t)addr : INADDR_ANY + 1;
    if (f)
        fclose(f);
    return found == INADDR_ANY + 1 ? INADDR_ANY : found;
}

/* By default HTTP listens on this host only (its socket is bound to 127.0.0.1, read from the
 * kernel's table: no traffic leaves loopback). One address holds at most 8 connections at
 * once: the next is closed unanswered, and served again once the others are gone. */
Test(http, this_host_only_by_default_and_a_few_connections_per_client)
{
    mq_http_cfg_t cfg;
    mq_http_cfg_init(&cfg, MQ_HTTP_ANY_PORT);
    cr_expect_str_eq(cfg.bind, "127.0.0.1");
    mq_http_t *h = mq_http_new(&cfg, NULL, NULL, 0);
    cr_assert_not_null(h, "%s", mq_err_last());
    int port = mq_http_port(h);
    static char body[4096];
    cr_expect_eq(test_http(port, NULL, "GET", "/healthz", body, sizeof body), 200);
    cr_expect_eq(s_listening_addr(port), htonl(INADDR_LOOPBACK),
                 "the default HTTP socket is not bound to 127.0.0.1");
    int held[8];
    for (int k = 0; k < 8; k++) {
        held[k] = s_connect(htonl(INADDR_LOOPBACK), port);
        cr_assert_geq(held[k], 0, "connection %d refused", k);
    }
    zclock_sleep(200); /* the daemon has taken them */
    cr_expect_neq(test_http(port, NULL, "GET", "/healthz", body, sizeof body), 200,
                  "a ninth connection from one address was served");
    for (int k = 0; k < 8; k++)
        close(held[k]);
    zclock_sleep(200);
    cr_expect_eq(test_http(port, NULL, "GET", "/healthz", body, sizeof body), 200);
    mq_http_destroy(&h);
}
