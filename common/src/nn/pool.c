/* The model's own threads (nn_internal.h, "Threads"): the caller and helpers that wait on a
 * condition variable between jobs, one job at a time. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include <cblas.h>

#include "nn_internal.h"

enum { MAX_PARTS = 64 };

static struct {
    pthread_mutex_t run; /* one job at a time */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    mq_nn_part_fn *fn;
    void *arg;
    int parts, helpers, pending;
    unsigned long gen;
} s_pool = {.run = PTHREAD_MUTEX_INITIALIZER,
            .mu = PTHREAD_MUTEX_INITIALIZER,
            .go = PTHREAD_COND_INITIALIZER,
            .done = PTHREAD_COND_INITIALIZER};

static void *s_helper(void *arg)
{
    const int part = (int)(intptr_t)arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&s_pool.mu);
    for (;;) {
        while (s_pool.gen == seen)
            pthread_cond_wait(&s_pool.go, &s_pool.mu);
        seen = s_pool.gen;
        if (part >= s_pool.parts)
            continue;
        mq_nn_part_fn *fn = s_pool.fn;
        void *fa = s_pool.arg;
        const int parts = s_pool.parts;
        pthread_mutex_unlock(&s_pool.mu);
        fn(fa, part, parts);
        pthread_mutex_lock(&s_pool.mu);
        if (--s_pool.pending == 0)
            pthread_cond_signal(&s_pool.done);
    }
    return NULL;
}

/* A child of fork has none of its parent's helpers. */
static void s_after_fork(void)
{
    pthread_mutex_init(&s_pool.run, NULL);
    pthread_mutex_init(&s_pool.mu, NULL);
    pthread_cond_init(&s_pool.go, NULL);
    pthread_cond_init(&s_pool.done, NULL);
    s_pool.helpers = 0;
    s_pool.pending = 0;
}

static pthread_once_t s_fork_once = PTHREAD_ONCE_INIT;

static void s_fork_hook(void)
{
    pthread_atfork(NULL, NULL, s_after_fork);
}

/* Whether OpenBLAS's idle threads sleep (mq_nn_pick_blas_core): if they spin, as they do for
 * 2^28 cycles after each call by default, a helper here would share a core with one of them
 * and gain nothing (measured: the same time as one thread), so a job keeps to one. */
static bool s_blas_threads_sleep(void)
{
    static int asleep = -1;
    int v = __atomic_load_n(&asleep, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *env = getenv(MQ_NN_BLAS_TIMEOUT_ENV);
        char *end;
        long t = env ? strtol(env, &end, 10) : 0;
        v = env && *env && !*end && t <= 16;
        __atomic_store_n(&asleep, v, __ATOMIC_RELAXED);
    }
    return v;
}

void mq_nn_parallel(mq_nn_part_fn *fn, void *arg, int parts)
{
    if (parts > MAX_PARTS)
        parts = MAX_PARTS;
    if (parts > 1 && !s_blas_threads_sleep())
        parts = 1;
    if (parts <= 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_once(&s_fork_once, s_fork_hook);
    pthread_mutex_lock(&s_pool.run);
    while (s_pool.helpers < parts - 1) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &at, s_helper, (void *)(intptr_t)(s_pool.helpers + 1));
        pthread_attr_destroy(&at);
        if (rc != 0)
            break;
        s_pool.helpers++;
    }
    if (parts > s_pool.helpers + 1)
        parts = s_pool.helpers + 1;
    pthread_mutex_lock(&s_pool.mu);
    s_pool.fn = fn;
    s_pool.arg = arg;
    s_pool.parts = parts;
    s_pool.pending = parts - 1;
    s_pool.gen++;
    pthread_cond_broadcast(&s_pool.go);
    pthread_mutex_unlock(&s_pool.mu);
    fn(arg, 0, parts);
    pthread_mutex_lock(&s_pool.mu);
    while (s_pool.pending > 0)
        pthread_cond_wait(&s_pool.done, &s_pool.mu);
    pthread_mutex_unlock(&s_pool.mu);
    pthread_mutex_unlock(&s_pool.run);
}

void mq_nn_parallel_blas(mq_nn_part_fn *fn, void *arg, int parts)
{
    const int threads = openblas_get_num_threads();
    if (parts <= 1 || threads <= 1) {
        fn(arg, 0, 1);
        return;
    }
    openblas_set_num_threads(1);
    mq_nn_parallel(fn, arg, parts);
    openblas_set_num_threads(threads);
}

void mq_nn_share(int count, int part, int parts, int *lo, int *hi)
{
    *lo = (int)((long)count * part / parts);
    *hi = (int)((long)count * (part + 1) / parts);
}

int mq_nn_parts(void)
{
    int t = openblas_get_num_threads();
    return t > 1 && s_blas_threads_sleep() ? (t < MAX_PARTS ? t : MAX_PARTS) : 1;
}

int mq_nn_parts_for(size_t count, size_t each)
{
    if (count * each < MQ_NN_PAR_MIN)
        return 1;
    size_t parts = (size_t)mq_nn_parts();
    return (int)(parts < count ? parts : count);
}
