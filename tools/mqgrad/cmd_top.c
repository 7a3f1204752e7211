/* mqgrad top: a live view of a training run, read from the scheduler's GET /metrics
 * (Prometheus text) every --interval seconds. On a terminal it redraws a full screen on the
 * alternate screen with plain ANSI escapes (q or Ctrl-C quits); anywhere else, or with
 * --plain, it prints one key=value line per poll, for logs. Everything over time (the
 * sparklines, the iteration rate) is what this process saw across its polls: the scheduler
 * serves only the present. */
#include <errno.h>
#include <langinfo.h>
#include <locale.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "httpc.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"
#include "promtext.h"

#define S_HIST 512       /* points kept per series: wider than any terminal */
#define S_RATE_WINDOW 5. /* seconds the iteration rate is measured over */
#define S_MARKS 64
#define S_STEPS 32
#define S_MAX_RANKS 256
#define S_LABEL_W 12 /* the label column */
#define S_SPARK_COL 42 /* where the sparklines start, so they line up */

#define S_M(x) "mqgrad_scheduler_" x

static const char *const s_phases[] = {"compute", "encode", "wait", "decode"};
enum { S_NPHASES = 4 };

typedef struct {
    double v[S_HIST];
    int n, next;
} s_series_t;

/* One poll's counters, for rates over the window. */
typedef struct {
    double t, iters, it_sum, it_count;
} s_mark_t;

typedef struct {
    /* flags */
    char scheduler[1024];
    char token_file[1024];
    double interval;
    long timeout_ms, count;
    bool once, plain, ascii;
    /* from the flags */
    mq_httpc_url_t url;
    char token[1024];
    bool has_token;
    bool tty, utf8, color;
    int rows, cols;
    /* what the polls saw */
    mq_promtext_t cur; /* the last answer */
    bool have;         /* cur holds one */
    bool ok;           /* the last poll was answered */
    int status;        /* its HTTP status (0: no answer at all) */
    char err[400];
    double last_ok; /* mq_now_s of the last answer */
    long polls;
    s_series_t loss, acc, bits;
    double last_iter, last_acc, last_test_loss;
    struct {
        int bits;
        double iter;
    } steps[S_STEPS];
    int nsteps;
    s_mark_t marks[S_MARKS];
    int nmarks;
    double rate, iter_ms;
} s_top_t;

/* ---- signals and the terminal --------------------------------------------------------- */

static volatile sig_atomic_t s_quit, s_winch, s_tstp, s_cont;

static void s_on_signal(int sig)
{
    if (sig == SIGWINCH)
        s_winch = 1;
    else if (sig == SIGTSTP)
        s_tstp = 1;
    else if (sig == SIGCONT)
        s_cont = 1;
    else
        s_quit = sig;
}

/* SA_RESTART: writes and reads carry on; poll() still returns EINTR (it is never restarted),
 * which is what wakes the main loop. */
static void s_handle(int sig, void (*fn)(int))
{
    struct sigaction sa = {.sa_handler = fn, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

static struct termios s_saved;
static bool s_raw, s_screen;

static void s_write(const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDOUT_FILENO, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* the terminal is gone: nothing left to show it */
        buf += w;
        n -= (size_t)w;
    }
}

/* Safe to call twice and from atexit: every exit path ends here. */
static void s_term_leave(void)
{
    if (s_screen) {
        static const char seq[] = "\x1b[0m\x1b[?7h\x1b[?25h\x1b[?1049l";
        s_write(seq, sizeof seq - 1);
        s_screen = false;
    }
    if (s_raw) {
        tcsetattr(STDIN_FILENO, TCSADRAIN, &s_saved);
        s_raw = false;
    }
}

/* Keys without Enter and without echo; ISIG stays, so Ctrl-C and Ctrl-Z are signals. The
 * alternate screen keeps the shell's screen as it was; no autowrap, so the last column of
 * the last row never scrolls. */
static void s_term_enter(void)
{
    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &s_saved) == 0) {
        struct termios t = s_saved;
        t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        t.c_cc[VMIN] = 0;
        t.c_cc[VTIME] = 0;
        s_raw = tcsetattr(STDIN_FILENO, TCSAFLUSH, &t) == 0;
    }
    static const char seq[] = "\x1b[?1049h\x1b[?7l\x1b[?25l\x1b[H\x1b[2J";
    s_write(seq, sizeof seq - 1);
    s_screen = true;
}

static void s_term_size(s_top_t *t)
{
    struct winsize ws;
    t->cols = 80;
    t->rows = 24;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
        t->cols = ws.ws_col < 1000 ? ws.ws_col : 1000;
        t->rows = ws.ws_row < 1000 ? ws.ws_row : 1000;
    }
}

/* ---- the screen buffer ---------------------------------------------------------------
 * A frame is built whole and written at once (no flicker). Text is counted in columns (one
 * per UTF-8 code point: every character drawn here is one column wide) and cut at the
 * width; escapes take none. Rows past MAX_ROWS are dropped. */

typedef struct {
    char *buf;
    size_t len, cap;
    int col, width, row, max_rows;
    bool ansi, color, skip;
    bool ascii; /* every non-ASCII character replaced: a look-alike or '?' */
} s_out_t;

static void s_put(s_out_t *o, const char *s, size_t n)
{
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 16384;
        while (cap < o->len + n + 1)
            cap *= 2;
        char *b = realloc(o->buf, cap);
        if (!b)
            return; /* a frame short: the next one tries again */
        o->buf = b;
        o->cap = cap;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
}

/* Columns S takes: its UTF-8 code points. */
static int s_cols(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += (*s & 0xC0) != 0x80;
    return n;
}

static void s_esc(s_out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_esc(s_out_t *o, const char *fmt, ...)
{
    if (o->skip || !o->ansi)
        return;
    char b[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (n > 0)
        s_put(o, b, (size_t)n < sizeof b ? (size_t)n : sizeof b - 1);
}

/* A color or attribute (SGR), only when colors are on. */
static void s_sgr(s_out_t *o, const char *code)
{
    if (o->color)
        s_esc(o, "\x1b[%sm", code);
}

static void s_text(s_out_t *o, const char *s)
{
    static const char *const look[][2] = {{"·", "|"}, {"×", "x"}, {"…", "..."}, {"→", "->"}};
    if (o->skip)
        return;
    while (*s && o->col < o->width) {
        size_t n = 1;
        while ((s[n] & 0xC0) == 0x80)
            n++;
        const unsigned char *u = (const unsigned char *)s;
        if ((n == 1 && (u[0] < ' ' || u[0] == 0x7f)) || (n == 2 && u[0] == 0xC2 && u[1] < 0xA0)) {
            /* A control character from the metrics (a label, a reason) never reaches the
             * terminal, where it could move the cursor or worse. */
            s_put(o, "?", 1);
            o->col++;
        } else if (o->ascii && (n > 1 || u[0] >= 0x80)) {
            const char *alike = "?";
            for (size_t i = 0; i < sizeof look / sizeof look[0]; i++)
                if (strlen(look[i][0]) == n && memcmp(look[i][0], s, n) == 0)
                    alike = look[i][1];
            o->ascii = false; /* the look-alikes are ASCII already */
            s_text(o, alike);
            o->ascii = true;
        } else {
            s_put(o, s, n);
            o->col++;
        }
        s += n;
    }
}

static void s_textf(s_out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_textf(s_out_t *o, const char *fmt, ...)
{
    char b[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    s_text(o, b);
}

static void s_pad_to(s_out_t *o, int col)
{
    while (!o->skip && o->col < col && o->col < o->width)
        s_text(o, " ");
}

static void s_begin(s_out_t *o)
{
    o->row++;
    o->col = 0;
    o->skip = o->row > o->max_rows;
    s_esc(o, "\x1b[%d;1H", o->row);
}

static void s_end(s_out_t *o)
{
    if (o->skip)
        return;
    s_sgr(o, "0");
    if (o->ansi)
        s_esc(o, "\x1b[K");
    else
        s_put(o, "\n", 1);
}

/* A row's label in the label column. */
static void s_label(s_out_t *o, const char *label)
{
    s_begin(o);
    s_sgr(o, "1");
    s_text(o, label);
    s_sgr(o, "0");
    s_pad_to(o, S_LABEL_W);
}

/* ---- formatting: every missing or NaN value is "-" ------------------------------------ */

/* A few rotating buffers, so several values fit in one printf. */
static char *s_buf(void)
{
    static char ring[16][64];
    static unsigned k;
    return ring[k++ % 16];
}

static const char *s_f(double v, const char *fmt)
{
    if (isnan(v))
        return "-";
    if (isinf(v))
        return v > 0 ? "+Inf" : "-Inf";
    char *b = s_buf();
    snprintf(b, 64, fmt, v);
    return b;
}

static const char *s_bytes(double v)
{
    if (!isfinite(v))
        return s_f(v, "%g");
    static const char *const units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    int u = 0;
    while (fabs(v) >= 1000 && u < 5) {
        v /= 1000;
        u++;
    }
    char *b = s_buf();
    snprintf(b, 64, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return b;
}

static const char *s_dur(double s)
{
    if (!isfinite(s) || s < 0)
        return "-";
    char *b = s_buf();
    long n = lround(s);
    if (n < 60)
        snprintf(b, 64, "%ld s", n);
    else if (n < 3600)
        snprintf(b, 64, "%ldm%02lds", n / 60, n % 60);
    else if (n < 86400)
        snprintf(b, 64, "%ldh%02ldm", n / 3600, n % 3600 / 60);
    else
        snprintf(b, 64, "%ldd%02ldh", n / 86400, n % 86400 / 3600);
    return b;
}

/* ---- metrics --------------------------------------------------------------------------- */

static const mq_promtext_sample_t *s_m(const s_top_t *t, const char *name)
{
    return t->have ? mq_promtext_find(&t->cur, name, NULL) : NULL;
}

static double s_v(const s_top_t *t, const char *name)
{
    const mq_promtext_sample_t *s = s_m(t, name);
    return s ? s->value : NAN;
}

static void s_push(s_series_t *s, double v)
{
    s->v[s->next] = v;
    s->next = (s->next + 1) % S_HIST;
    if (s->n < S_HIST)
        s->n++;
}

/* The I-th of the last K points, oldest first. */
static double s_at(const s_series_t *s, int k, int i)
{
    return s->v[((s->next - k + i) % S_HIST + S_HIST) % S_HIST];
}

/* What changed since the last answer: the rate window, the series, the bit steps. */
static void s_update(s_top_t *t, double now)
{
    double iters = s_v(t, S_M("iterations_total"));
    if (isnan(iters))
        iters = s_v(t, S_M("iteration")); /* a scheduler without the counter */
    s_mark_t m = {now, iters, s_v(t, S_M("iteration_seconds_sum")),
                  s_v(t, S_M("iteration_seconds_count"))};
    /* A counter that went down is a restarted scheduler: the old marks mean nothing now. */
    if (t->nmarks && !(iters >= t->marks[t->nmarks - 1].iters))
        t->nmarks = 0;
    if (t->nmarks == S_MARKS) {
        memmove(t->marks, t->marks + 1, sizeof t->marks[0] * (S_MARKS - 1));
        t->nmarks--;
    }
    t->marks[t->nmarks++] = m;
    /* Keep the newest mark at least the window old, and nothing older. */
    while (t->nmarks > 2 && now - t->marks[1].t >= S_RATE_WINDOW) {
        memmove(t->marks, t->marks + 1, sizeof t->marks[0] * (size_t)(t->nmarks - 1));
        t->nmarks--;
    }
    const s_mark_t *a = &t->marks[0];
    t->rate = t->nmarks >= 2 && now > a->t ? (iters - a->iters) / (now - a->t) : NAN;
    double dc = m.it_count - a->it_count;
    t->iter_ms = t->nmarks >= 2 && dc > 0 ? 1000 * (m.it_sum - a->it_sum) / dc
                 : m.it_count > 0         ? 1000 * m.it_sum / m.it_count
                                          : NAN;

    double iter = s_v(t, S_M("iteration")), bits = s_v(t, S_M("bits"));
    if (!isnan(iter) && iter != t->last_iter) {
        s_push(&t->loss, s_v(t, S_M("loss")));
        s_push(&t->bits, bits);
        t->last_iter = iter;
    }
    /* An evaluation changes the accuracy or the test loss; repeating polls do not. */
    double acc = s_v(t, S_M("test_accuracy_ratio")), tl = s_v(t, S_M("test_loss"));
    bool same_tl = tl == t->last_test_loss || (isnan(tl) && isnan(t->last_test_loss));
    if (isfinite(acc) && (acc != t->last_acc || !same_tl)) {
        s_push(&t->acc, acc);
        t->last_acc = acc;
        t->last_test_loss = tl;
    }
    if (isfinite(bits) && (t->nsteps == 0 || (int)bits != t->steps[t->nsteps - 1].bits)) {
        if (t->nsteps == S_STEPS) {
            memmove(t->steps, t->steps + 1, sizeof t->steps[0] * (S_STEPS - 1));
            t->nsteps--;
        }
        t->steps[t->nsteps].bits = (int)bits;
        t->steps[t->nsteps].iter = iter;
        t->nsteps++;
    }
}

static void s_poll(s_top_t *t)
{
    char *body;
    size_t len;
    double now = mq_now_s();
    t->polls++;
    if (mq_httpc_get(&t->url, t->has_token ? t->token : NULL, t->timeout_ms, &s_quit, &body,
                     &len, &t->status) != 0) {
        t->ok = false;
        t->rate = NAN;
        snprintf(t->err, sizeof t->err, "%s", mq_err_last());
        return;
    }
    mq_promtext_t p;
    int rc = mq_promtext_parse(body, len, &p);
    free(body);
    if (rc != 0) {
        mq_promtext_free(&p);
        t->ok = false;
        snprintf(t->err, sizeof t->err, "%s", mq_err_last());
        return;
    }
    mq_promtext_free(&t->cur);
    t->cur = p;
    t->have = true;
    t->ok = true;
    t->last_ok = now;
    t->err[0] = '\0';
    if (!s_m(t, S_M("iteration")) && !s_m(t, S_M("members")))
        snprintf(t->err, sizeof t->err,
                 "%s answers, but without mqgrad_scheduler_* metrics (is it the scheduler?)",
                 t->url.where);
    else if (p.bad)
        snprintf(t->err, sizeof t->err, "%d malformed metric line%s skipped (line %d: %s)",
                 p.bad, p.bad == 1 ? "" : "s", p.bad_line, p.bad_why);
    s_update(t, now);
}

/* ---- the full view ---------------------------------------------------------------------- */

static void s_spark(s_out_t *o, const s_top_t *t, const s_series_t *s, int width)
{
    static const char *const utf8[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
    static const char *const ascii[] = {"_", ".", "-", "~", "=", "+", "*", "#"};
    const char *const *lv = t->utf8 ? utf8 : ascii;
    int k = s->n < width ? s->n : width;
    if (k <= 0)
        return;
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < k; i++) {
        double v = s_at(s, k, i);
        if (isfinite(v)) {
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
    }
    for (int i = 0; i < k; i++) {
        double v = s_at(s, k, i);
        if (!isfinite(v)) {
            s_text(o, " ");
            continue;
        }
        int l = hi > lo ? (int)lround((v - lo) / (hi - lo) * 7) : 3;
        s_text(o, lv[l < 0 ? 0 : l > 7 ? 7 : l]);
    }
}

/* The sparkline of S from the sparkline column to the end of the row. */
static void s_spark_col(s_out_t *o, const s_top_t *t, const s_series_t *s)
{
    if (o->col >= S_SPARK_COL - 1)
        s_text(o, " ");
    s_pad_to(o, S_SPARK_COL);
    s_spark(o, t, s, o->width - o->col - 1);
}

static void s_title(s_out_t *o, const s_top_t *t)
{
    s_begin(o);
    s_sgr(o, "7");
    s_textf(o, " mqgrad top · %s", t->url.where);
    const mq_promtext_sample_t *bi = s_m(t, "mqgrad_build_info");
    const char *ver = bi ? mq_promtext_label(bi, "version") : NULL;
    if (ver)
        s_textf(o, " · scheduler %s", ver);
    double start = s_v(t, "process_start_time_seconds");
    if (start > 0)
        s_textf(o, " · up %s", s_dur((double)time(NULL) - start));
    char clock[16];
    time_t now = time(NULL);
    struct tm tm;
    strftime(clock, sizeof clock, "%H:%M:%S", localtime_r(&now, &tm));
    char right[64];
    snprintf(right, sizeof right, "every %s s · q quits · %s ", s_f(t->interval, "%g"), clock);
    if (o->ansi) { /* the right part only when it fits */
        int rlen = s_cols(right);
        if (o->col + 2 + rlen <= o->width) {
            s_pad_to(o, o->width - rlen);
            s_text(o, right);
        }
        s_pad_to(o, o->width);
    }
    s_end(o);
}

static void s_iteration(s_out_t *o, const s_top_t *t)
{
    double it = s_v(t, S_M("iteration")), plan = s_v(t, S_M("iterations_planned"));
    s_label(o, "iteration");
    s_text(o, s_f(it, "%.0f"));
    if (plan > 0) {
        s_textf(o, " / %.0f", plan);
        if (!isnan(it))
            s_textf(o, "  (%.1f %%)", 100 * it / plan);
    } else if (plan == 0) {
        s_text(o, "  (until the time budget)");
    }
    s_textf(o, "   %s it/s", s_f(t->rate, "%.2f"));
    if (plan > 0 && t->rate > 0 && it < plan)
        s_textf(o, "   ETA %s", s_dur((plan - it) / t->rate));
    if (!isnan(t->iter_ms))
        s_textf(o, "   %s ms per iteration", s_f(t->iter_ms, "%.0f"));
    s_end(o);
}

static void s_curves(s_out_t *o, const s_top_t *t)
{
    s_label(o, "loss");
    s_text(o, s_f(s_v(t, S_M("loss")), "%.4f"));
    s_spark_col(o, t, &t->loss);
    s_end(o);

    double acc = s_v(t, S_M("test_accuracy_ratio")), tl = s_v(t, S_M("test_loss"));
    s_label(o, "accuracy");
    s_text(o, isfinite(acc) ? s_f(100 * acc, "%.2f %%") : "-");
    if (!isnan(tl))
        s_textf(o, "  (test loss %s)", s_f(tl, "%.4f"));
    s_spark_col(o, t, &t->acc);
    s_end(o);

    double bits = s_v(t, S_M("bits"));
    s_label(o, "bits");
    s_text(o, s_f(bits, "%.0f"));
    if (bits == 32)
        s_text(o, " (fp32)");
    if (t->nsteps && !isnan(t->steps[t->nsteps - 1].iter) && t->nsteps > 1)
        s_textf(o, "  since it %.0f", t->steps[t->nsteps - 1].iter);
    s_spark_col(o, t, &t->bits);
    s_end(o);

    /* The bit steps, newest last; the oldest go first when the row is full. */
    if (t->nsteps > 1) {
        s_label(o, "");
        const char *arrow = t->utf8 ? " → " : " -> ";
        int room = o->width - o->col - 2;
        char strip[S_STEPS * 8];
        for (int first = 0; first < t->nsteps; first++) {
            size_t w = 0;
            for (int i = first; i < t->nsteps; i++)
                w += (size_t)snprintf(strip + w, sizeof strip - w, "%s%d", i > first ? arrow : "",
                                      t->steps[i].bits);
            if (s_cols(strip) <= room || first == t->nsteps - 1) {
                if (first)
                    s_text(o, "… ");
                s_text(o, strip);
                break;
            }
        }
        s_end(o);
    }
}

static void s_traffic(s_out_t *o, const s_top_t *t)
{
    double pushed = s_v(t, S_M("iteration_pushed_bytes")), members = s_v(t, S_M("members"));
    double fp32 = s_v(t, S_M("fp32_push_bytes"));
    double per = members > 0 ? pushed / members : NAN;
    s_label(o, "push/iter");
    s_textf(o, "%s per worker", s_bytes(per));
    if (fp32 > 0) {
        s_textf(o, " vs fp32 %s: %s", s_bytes(fp32), s_f(per / fp32, "%.3f"));
        double x = per > fp32 ? per / fp32 : fp32 / per;
        if (per > 0)
            s_textf(o, " (%s× %s)", s_f(x, x >= 100 ? "%.0f" : "%.1f"),
                    per > fp32 ? "more" : "less");
    } else {
        s_text(o, " vs fp32 -");
    }
    s_end(o);
    s_label(o, "traffic");
    s_textf(o, "pushed %s · pulled %s in all", s_bytes(s_v(t, S_M("pushed_bytes_total"))),
            s_bytes(s_v(t, S_M("pulled_bytes_total"))));
    s_end(o);
}

static void s_cluster(s_out_t *o, const s_top_t *t)
{
    double paused = s_v(t, S_M("paused")), link = s_v(t, S_M("link_mbps"));
    double sim = s_v(t, S_M("simulated_clock"));
    s_label(o, "cluster");
    s_textf(o, "%s members · %s workers · %s servers · ", s_f(s_v(t, S_M("members")), "%.0f"),
            s_f(s_v(t, S_M("workers")), "%.0f"), s_f(s_v(t, S_M("servers")), "%.0f"));
    if (paused > 0) {
        s_sgr(o, "1;33");
        s_text(o, "PAUSED (waiting for workers)");
        s_sgr(o, "0");
    } else {
        s_text(o, paused == 0 ? "running" : "-");
    }
    if (link > 0)
        s_textf(o, "   link %s Mbit/s", s_f(link, "%g"));
    if (!isnan(sim))
        s_textf(o, "%s%s clock", link > 0 ? ", " : "   ", sim > 0 ? "simulated" : "real");
    s_end(o);

    double ck_it = s_v(t, S_M("last_checkpoint_iteration"));
    double ck_ts = s_v(t, S_M("last_checkpoint_timestamp_seconds"));
    s_label(o, "health");
    if (ck_ts > 0)
        s_textf(o, "checkpoint it %s, %s ago", s_f(ck_it, "%.0f"),
                s_dur((double)time(NULL) - ck_ts));
    else
        s_text(o, ck_ts == 0 ? "checkpoint none yet" : "checkpoint -");
    s_textf(o, " · agent fallbacks %s · stragglers cut %s",
            s_f(s_v(t, S_M("agent_fallbacks_total")), "%.0f"),
            s_f(s_v(t, S_M("stragglers_total")), "%.0f"));
    s_end(o);

    s_label(o, "drops");
    double sum = 0;
    int n = 0;
    for (size_t i = 0; t->have && i < t->cur.n; i++) {
        const mq_promtext_sample_t *s = &t->cur.samples[i];
        if (strcmp(s->name, S_M("dropped_messages_total")) != 0)
            continue;
        n++;
        if (s->value > 0)
            sum += s->value;
    }
    if (n == 0) {
        s_text(o, "-");
    } else if (sum == 0) {
        s_text(o, "none");
    } else {
        s_sgr(o, "33");
        s_textf(o, "%.0f:", sum);
        s_sgr(o, "0");
        int k = 0;
        for (size_t i = 0; i < t->cur.n; i++) {
            const mq_promtext_sample_t *s = &t->cur.samples[i];
            const char *why = mq_promtext_label(s, "reason");
            if (strcmp(s->name, S_M("dropped_messages_total")) == 0 && s->value > 0)
                s_textf(o, "%s %s %.0f", k++ ? " ·" : "", why ? why : "?", s->value);
        }
    }
    s_end(o);
}

static int s_rank_cmp(const void *a, const void *b)
{
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    long i = strtol(x, NULL, 10), j = strtol(y, NULL, 10);
    return i != j ? (i < j ? -1 : 1) : strcmp(x, y);
}

/* The ranks that have any per-worker metric, in numeric order. */
static int s_ranks(const s_top_t *t, const char **ranks)
{
    int n = 0;
    for (size_t i = 0; t->have && i < t->cur.n && n < S_MAX_RANKS; i++) {
        const mq_promtext_sample_t *s = &t->cur.samples[i];
        if (strncmp(s->name, S_M("worker_"), strlen(S_M("worker_"))) != 0)
            continue;
        const char *r = mq_promtext_label(s, "rank");
        if (!r)
            continue;
        bool seen = false;
        for (int k = 0; k < n && !seen; k++)
            seen = strcmp(ranks[k], r) == 0;
        if (!seen)
            ranks[n++] = r;
    }
    qsort(ranks, (size_t)n, sizeof *ranks, s_rank_cmp);
    return n;
}

static void s_workers(s_out_t *o, const s_top_t *t)
{
    static const char *const glyph_utf8[] = {"█", "▓", "░", "▒"};
    static const char *const glyph_ascii[] = {"#", "=", ".", "-"};
    static const char *const color[] = {"32", "33", "90", "36"};
    const char *const *glyph = t->utf8 ? glyph_utf8 : glyph_ascii;
    const char *ranks[S_MAX_RANKS];
    int n = s_ranks(t, ranks);
    s_begin(o);
    s_end(o);
    s_label(o, "workers");
    /* Under 100 columns the loss and straggle columns give way to the bar (the straggles
     * add up in "stragglers cut" above). */
    bool narrow = o->width < 100;
    s_text(o, "compute  encode    wait  decode  total ms");
    s_text(o, narrow ? "  time split" : "    loss straggles  time split");
    s_end(o);
    if (n == 0) {
        s_begin(o);
        s_text(o, "  -");
        s_end(o);
        return;
    }
    double ms[S_MAX_RANKS][S_NPHASES], total[S_MAX_RANKS], longest = 0;
    for (int r = 0; r < n; r++) {
        total[r] = 0;
        for (int p = 0; p < S_NPHASES; p++) {
            const mq_promtext_sample_t *s = mq_promtext_find(
                &t->cur, S_M("worker_seconds"), "rank", ranks[r], "phase", s_phases[p], NULL);
            ms[r][p] = s ? 1000 * s->value : NAN;
            if (isfinite(ms[r][p]) && ms[r][p] > 0)
                total[r] += ms[r][p];
        }
        longest = total[r] > longest ? total[r] : longest;
    }
    /* Room for the rows: the legend and the status row stay. */
    int room = o->max_rows - o->row - 1, shown = n;
    if (o->ansi && shown > room)
        shown = room > 1 ? room - 1 : 0;
    for (int r = 0; r < shown; r++) {
        const mq_promtext_sample_t *loss =
            mq_promtext_find(&t->cur, S_M("worker_loss"), "rank", ranks[r], NULL);
        const mq_promtext_sample_t *st =
            mq_promtext_find(&t->cur, S_M("worker_straggles_total"), "rank", ranks[r], NULL);
        s_begin(o);
        s_textf(o, "  rank %-4s", ranks[r]);
        s_pad_to(o, S_LABEL_W);
        for (int p = 0; p < S_NPHASES; p++)
            s_textf(o, p ? "%8s" : "%7s", s_f(ms[r][p], "%.1f"));
        s_textf(o, "%10s  ", total[r] > 0 ? s_f(total[r], "%.1f") : "-");
        if (!narrow)
            s_textf(o, "%6s%10s  ", s_f(loss ? loss->value : NAN, "%.4f"),
                    s_f(st ? st->value : NAN, "%.0f"));
        /* Cells proportional to the slowest worker's total, so a straggler's bar is the
         * longest; cumulative rounding keeps the phases adding up. */
        int bar = o->width - o->col - 1;
        if (bar > 48)
            bar = 48;
        double cum = 0;
        int drawn = 0;
        for (int p = 0; p < S_NPHASES && bar > 0 && longest > 0; p++) {
            if (!(ms[r][p] > 0))
                continue;
            cum += ms[r][p];
            int upto = (int)lround(cum / longest * bar);
            s_sgr(o, color[p]);
            for (; drawn < upto; drawn++)
                s_text(o, glyph[p]);
            s_sgr(o, "0");
        }
        s_end(o);
    }
    if (shown < n) {
        s_begin(o);
        s_textf(o, "  … %d more worker%s (a taller window shows them)", n - shown,
                n - shown == 1 ? "" : "s");
        s_end(o);
    }
    s_begin(o);
    s_pad_to(o, S_LABEL_W);
    for (int p = 0; p < S_NPHASES; p++) {
        s_sgr(o, color[p]);
        s_text(o, glyph[p]);
        s_sgr(o, "0");
        s_textf(o, " %s  ", s_phases[p]);
    }
    s_end(o);
}

static void s_status(s_out_t *o, const s_top_t *t)
{
    s_begin(o);
    if (t->polls == 0) {
        s_textf(o, "asking %s for %s ...", t->url.where, t->url.path);
    } else if (!t->ok) {
        s_sgr(o, "1;31");
        s_textf(o, "scheduler %s: %s, retrying", t->status ? "error" : "unreachable", t->err);
        if (t->have)
            s_textf(o, " (last answer %s ago)", s_dur(mq_now_s() - t->last_ok));
    } else if (t->err[0]) {
        s_sgr(o, "33");
        s_text(o, t->err);
    } else {
        char clock[16];
        time_t now = time(NULL);
        struct tm tm;
        strftime(clock, sizeof clock, "%H:%M:%S", localtime_r(&now, &tm));
        s_sgr(o, "2");
        s_textf(o, "updated %s · poll %ld", clock, t->polls);
    }
    s_end(o);
}

/* The whole view into O. ANSI: a frame for the alternate screen (rows placed, the rest
 * cleared, the status on the last row); else plain lines (--once on a terminal). */
static void s_render(const s_top_t *t, s_out_t *o, bool ansi)
{
    o->len = 0;
    if (o->buf)
        o->buf[0] = '\0';
    o->row = 0;
    o->ansi = ansi;
    o->color = ansi && t->color;
    o->ascii = !t->utf8;
    o->width = t->cols;
    o->max_rows = ansi ? t->rows - 1 : 1 << 20;
    s_title(o, t);
    s_begin(o);
    s_end(o);
    s_iteration(o, t);
    s_curves(o, t);
    s_traffic(o, t);
    s_cluster(o, t);
    s_workers(o, t);
    if (ansi) {
        if (o->row < t->rows) {
            o->skip = false;
            s_esc(o, "\x1b[%d;1H\x1b[J", o->row + 1);
        }
        o->row = t->rows - 1;
        o->max_rows = t->rows;
    } else {
        s_begin(o);
        s_end(o);
    }
    s_status(o, t);
}

static void s_draw(const s_top_t *t, s_out_t *o)
{
    s_render(t, o, true);
    s_write(o->buf, o->len);
}

/* ---- the line for logs ------------------------------------------------------------------ */

static void s_print_line(const s_top_t *t, FILE *out)
{
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    fprintf(out, "time=%s", stamp);
    if (!t->ok) {
        /* The reason quoted, its own quotes made single: one field whatever it says. */
        char why[sizeof t->err];
        snprintf(why, sizeof why, "%s", t->err);
        for (char *c = why; *c; c++)
            if (*c == '"')
                *c = '\'';
        fprintf(out, " status=%s error=\"%s\"\n", t->status ? "error" : "unreachable", why);
        fflush(out);
        return;
    }
    double pushed = s_v(t, S_M("iteration_pushed_bytes")), members = s_v(t, S_M("members"));
    double fp32 = s_v(t, S_M("fp32_push_bytes")), per = members > 0 ? pushed / members : NAN;
    double drops = NAN;
    for (size_t i = 0; i < t->cur.n; i++)
        if (strcmp(t->cur.samples[i].name, S_M("dropped_messages_total")) == 0)
            drops = (isnan(drops) ? 0 : drops) + t->cur.samples[i].value;
    double ck_ts = s_v(t, S_M("last_checkpoint_timestamp_seconds"));
    /* One field at a time: s_f's buffers are few. */
    fprintf(out, " status=ok iter=%s", s_f(s_v(t, S_M("iteration")), "%.0f"));
    fprintf(out, " planned=%s", s_f(s_v(t, S_M("iterations_planned")), "%.0f"));
    fprintf(out, " rate=%s", s_f(t->rate, "%.2f"));
    fprintf(out, " loss=%s", s_f(s_v(t, S_M("loss")), "%.4f"));
    fprintf(out, " acc=%s", s_f(s_v(t, S_M("test_accuracy_ratio")), "%.4f"));
    fprintf(out, " test_loss=%s", s_f(s_v(t, S_M("test_loss")), "%.4f"));
    fprintf(out, " bits=%s", s_f(s_v(t, S_M("bits")), "%.0f"));
    fprintf(out, " push_bytes=%s", s_f(per, "%.0f"));
    fprintf(out, " fp32_bytes=%s", s_f(fp32, "%.0f"));
    fprintf(out, " push_ratio=%s", s_f(fp32 > 0 ? per / fp32 : NAN, "%.4f"));
    fprintf(out, " members=%s", s_f(members, "%.0f"));
    fprintf(out, " workers=%s", s_f(s_v(t, S_M("workers")), "%.0f"));
    fprintf(out, " servers=%s", s_f(s_v(t, S_M("servers")), "%.0f"));
    fprintf(out, " paused=%s", s_f(s_v(t, S_M("paused")), "%.0f"));
    fprintf(out, " stragglers=%s", s_f(s_v(t, S_M("stragglers_total")), "%.0f"));
    fprintf(out, " fallbacks=%s", s_f(s_v(t, S_M("agent_fallbacks_total")), "%.0f"));
    fprintf(out, " drops=%s", s_f(drops, "%.0f"));
    fprintf(out, " ckpt_iter=%s", s_f(s_v(t, S_M("last_checkpoint_iteration")), "%.0f"));
    fprintf(out, " ckpt_age=%s", ck_ts > 0 ? s_f((double)now - ck_ts, "%.0f") : "-");
    /* Each worker's last iteration in ms, rank order. */
    const char *ranks[S_MAX_RANKS];
    int n = s_ranks(t, ranks);
    fputs(" worker_ms=", out);
    for (int r = 0; r < n; r++) {
        double sum = NAN;
        for (int p = 0; p < S_NPHASES; p++) {
            const mq_promtext_sample_t *s = mq_promtext_find(
                &t->cur, S_M("worker_seconds"), "rank", ranks[r], "phase", s_phases[p], NULL);
            if (s && isfinite(s->value))
                sum = (isnan(sum) ? 0 : sum) + 1000 * s->value;
        }
        fprintf(out, "%s%s", r ? "," : "", s_f(sum, "%.1f"));
    }
    fputs(n ? "\n" : "-\n", out);
    fflush(out);
}

/* ---- the loops -------------------------------------------------------------------------- */

/* Waits until mq_now_s() reaches UNTIL, a signal asks to quit, or (KEYS) a key is read: q
 * quits, space or r polls now. Returns true if the caller should redraw first (a resize). */
static bool s_wait(double until, bool keys)
{
    for (;;) {
        if (s_quit || s_winch || s_tstp || s_cont)
            return s_winch || s_tstp || s_cont;
        double left = until - mq_now_s();
        if (left <= 0)
            return false;
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
        int n = poll(&pfd, keys ? 1 : 0, (int)ceil(left * 1000));
        if (n <= 0 || !(pfd.revents & (POLLIN | POLLHUP)))
            continue;
        char c[64];
        ssize_t r = read(STDIN_FILENO, c, sizeof c);
        if (r == 0)
            keys = false; /* the terminal's input is gone: stop listening, keep showing */
        for (ssize_t i = 0; i < r; i++) {
            if (c[i] == 'q' || c[i] == 'Q' || c[i] == 3)
                s_quit = -1;
            else if (c[i] == ' ' || c[i] == 'r')
                return false;
        }
    }
}

/* Ctrl-Z: give the terminal back as it was, stop, and take it again on fg. */
static void s_suspend(void)
{
    s_term_leave();
    signal(SIGTSTP, SIG_DFL);
    raise(SIGTSTP); /* stops here until SIGCONT */
    s_handle(SIGTSTP, s_on_signal);
    s_tstp = s_cont = 0;
    s_term_enter();
}

static int s_run_screen(s_top_t *t)
{
    s_out_t o = {0};
    s_handle(SIGWINCH, s_on_signal);
    s_handle(SIGTSTP, s_on_signal);
    s_handle(SIGCONT, s_on_signal);
    s_term_size(t);
    s_term_enter();
    atexit(s_term_leave);
    bool keys = s_raw;
    s_draw(t, &o); /* a frame before the first answer, which may take a timeout */
    for (;;) {
        double t0 = mq_now_s();
        s_poll(t);
        if (s_quit)
            break;
        s_draw(t, &o);
        if (t->count && t->polls >= t->count)
            break;
        while (s_wait(t0 + t->interval, keys)) {
            if (s_tstp)
                s_suspend();
            if (s_cont) {
                s_cont = 0;
                s_term_leave(); /* a shell may have changed the modes while we were stopped */
                s_term_enter();
            }
            s_winch = 0;
            s_term_size(t);
            s_draw(t, &o);
        }
        if (s_quit)
            break;
    }
    s_term_leave();
    free(o.buf);
    return s_quit ? 0 : t->ok ? 0 : 1;
}

static int s_run_lines(s_top_t *t)
{
    for (;;) {
        double t0 = mq_now_s();
        s_poll(t);
        if (s_quit)
            break;
        s_print_line(t, stdout);
        if (t->count && t->polls >= t->count)
            break;
        s_wait(t0 + t->interval, false);
        s_winch = s_tstp = s_cont = 0;
        if (s_quit)
            break;
    }
    return s_quit ? 0 : t->ok ? 0 : 1;
}

/* --once: one poll, the view (a terminal) or the line (anything else). */
static int s_run_once(s_top_t *t)
{
    s_poll(t);
    if (!t->ok) {
        fprintf(stderr, "mqgrad top: scheduler %s: %s\n", t->status ? "error" : "unreachable",
                t->err);
        return 1;
    }
    if (t->tty && !t->plain) {
        s_out_t o = {0};
        s_render(t, &o, false);
        fputs(o.buf ? o.buf : "", stdout);
        free(o.buf);
    } else {
        s_print_line(t, stdout);
    }
    return 0;
}

/* ---- flags -------------------------------------------------------------------------------- */

/* A bearer token may hold no control characters or spaces: it goes into a header line. */
static int s_token_ok(const char *tok, const char *from)
{
    if (!*tok) {
        fprintf(stderr, "mqgrad top: %s is empty\n", from);
        return 2;
    }
    for (const char *c = tok; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f) {
            fprintf(stderr, "mqgrad top: %s holds a space or control character\n", from);
            return 2;
        }
    return 0;
}

static int s_token(s_top_t *t)
{
    char from[1100];
    if (t->token_file[0]) {
        char *data;
        size_t len;
        if (mq_read_file(t->token_file, &data, &len) != 0) {
            fprintf(stderr, "mqgrad top: --http-token-file: %s\n", mq_err_last());
            return 2;
        }
        while (len && (data[len - 1] == '\n' || data[len - 1] == '\r' || data[len - 1] == ' '))
            data[--len] = '\0';
        if (len >= sizeof t->token) {
            fprintf(stderr, "mqgrad top: the token in %s is over %zu characters\n",
                    t->token_file, sizeof t->token - 1);
            free(data);
            return 2;
        }
        snprintf(t->token, sizeof t->token, "%s", data);
        free(data);
        snprintf(from, sizeof from, "the token file %s", t->token_file);
    } else {
        const char *env = getenv("MQGRAD_HTTP_TOKEN");
        if (!env)
            return 0;
        if (strlen(env) >= sizeof t->token) {
            fprintf(stderr, "mqgrad top: MQGRAD_HTTP_TOKEN is over %zu characters\n",
                    sizeof t->token - 1);
            return 2;
        }
        snprintf(t->token, sizeof t->token, "%s", env);
        snprintf(from, sizeof from, "MQGRAD_HTTP_TOKEN");
    }
    t->has_token = true;
    return s_token_ok(t->token, from);
}

static int s_parse(s_top_t *t, int argc, char **argv)
{
    snprintf(t->scheduler, sizeof t->scheduler, "http://127.0.0.1:8000");
    t->interval = 1;
    t->timeout_ms = 2000;
    const mq_flag_t flags[] = {
        {"scheduler", "MQGRAD_TOP_SCHEDULER", MQ_FLAG_STR, t->scheduler, sizeof t->scheduler, 0,
         0, "the scheduler's HTTP address: http://HOST:PORT[/PATH] or HOST[:PORT] (port 8000, "
            "path /metrics when absent)"},
        {"interval", NULL, MQ_FLAG_DOUBLE, &t->interval, 0, 0.1, 3600, "seconds between polls"},
        {"timeout", NULL, MQ_FLAG_LONG, &t->timeout_ms, 0, 50, 600000,
         "milliseconds a poll may take"},
        {"count", NULL, MQ_FLAG_LONG, &t->count, 0, 0, 1e15,
         "stop after this many polls (0 = until q, Ctrl-C or SIGTERM)"},
        {"once", NULL, MQ_FLAG_BOOL, &t->once, 0, 0, 0,
         "one snapshot, then exit: 0 if the scheduler answered, 1 if not"},
        {"plain", NULL, MQ_FLAG_BOOL, &t->plain, 0, 0, 0,
         "one key=value line per poll even on a terminal (the default elsewhere)"},
        {"ascii", NULL, MQ_FLAG_BOOL, &t->ascii, 0, 0, 0,
         "no Unicode block characters, even under a UTF-8 locale"},
        {"http-token-file", "MQGRAD_HTTP_TOKEN_FILE", MQ_FLAG_STR, t->token_file,
         sizeof t->token_file, 0, 0,
         "file holding the bearer token the scheduler's /metrics wants (else $MQGRAD_HTTP_TOKEN)"},
        {0},
    };
    char name[] = "mqgrad top";
    argv[0] = name;
    int rc = mq_flags_parse(flags, argc, argv,
                            "usage: mqgrad top [--scheduler URL] [--interval S] [--once | "
                            "--count N] [--plain]\n"
                            "A live view of a training run from the scheduler's /metrics (its "
                            "--http-port): iteration and rate,\n"
                            "loss, accuracy, bits, bytes against fp32, each worker's time "
                            "split, stragglers, membership, drops.\n"
                            "Keys: q quits, space polls now. Not on a terminal (or with "
                            "--plain): one key=value line per poll.\n"
                            "Exit: 0 on q, Ctrl-C or SIGTERM; with --once or --count, 0 if "
                            "the last poll was answered, else 1;\n"
                            "2 for a bad flag.",
                            NULL, 0, NULL);
    if (rc != 0)
        return rc;
    if (mq_httpc_url_parse(t->scheduler, "8000", "/metrics", &t->url) != 0) {
        fprintf(stderr, "mqgrad top: --scheduler %s\n", mq_err_last());
        return 2;
    }
    if (t->once && t->count > 1) {
        fprintf(stderr, "mqgrad top: --once and --count %ld: one or the other\n", t->count);
        return 2;
    }
    return s_token(t);
}

int mq_cmd_top(int argc, char **argv)
{
    s_top_t *t = calloc(1, sizeof *t);
    if (!t) {
        fprintf(stderr, "mqgrad top: out of memory\n");
        return 1;
    }
    t->last_iter = t->last_acc = t->last_test_loss = NAN;
    t->rate = t->iter_ms = NAN;
    int rc = s_parse(t, argc, argv);
    if (rc != 0) {
        free(t);
        return rc == 1 ? 0 : rc;
    }
    /* Only LC_CTYPE: numbers keep the C locale's format in the view and in the lines. */
    setlocale(LC_CTYPE, "");
    const char *term = getenv("TERM");
    t->tty = isatty(STDOUT_FILENO) && term && *term && strcmp(term, "dumb") != 0;
    t->utf8 = !t->ascii && strcmp(nl_langinfo(CODESET), "UTF-8") == 0;
    t->color = !getenv("NO_COLOR");
    if (t->tty)
        s_term_size(t);
    else
        t->cols = 1 << 20;
    s_handle(SIGINT, s_on_signal);
    s_handle(SIGTERM, s_on_signal);
    s_handle(SIGHUP, s_on_signal);
    if (t->once)
        rc = s_run_once(t);
    else if (t->tty && !t->plain)
        rc = s_run_screen(t);
    else
        rc = s_run_lines(t);
    mq_promtext_free(&t->cur);
    free(t);
    return rc;
}
