/* The service skeleton (mq_service_actor, mqgrad/service.h) with a service written here:
 * what its owner sees on the pipe when the start works, when it fails, and when the loop
 * ends by itself, and that the service's own operations run in their order. */
#include <criterion/criterion.h>
#include <string.h>

#include "mqgrad/service.h"
#include "mqgrad/util.h"

typedef struct {
    int fail;             /* the exit code start returns (0: it works) */
    bool end_on_command;  /* the command "END" returns -1: the loop ends by itself */
    /* what happened, read by the test once the actor is gone */
    int starts, stops, terms, ticks, commands;
    bool zeroed;          /* the state was zeroed when start saw it */
    char last_command[32];
} s_probe_t;

typedef struct {
    s_probe_t *probe;
    mq_drops_t drops;
    char pad[4096];
} s_state_t;

static int s_start(void *arg, mq_service_t *svc)
{
    s_state_t *self = arg;
    s_probe_t *p = svc->cfg;
    bool zero = true;
    for (size_t i = 0; i < sizeof self->pad; i++)
        zero = zero && self->pad[i] == 0;
    p->zeroed = zero && !self->probe;
    self->probe = p;
    p->starts++;
    if (p->fail) {
        mq_err_set("the probe's port is taken");
        return p->fail;
    }
    svc->port = 4242;
    self->drops.count[MQ_DROP_TYPE] = 3;
    svc->drops = &self->drops;
    return 0;
}

static int s_command(void *arg, const char *cmd, zmsg_t *rest)
{
    s_probe_t *p = ((s_state_t *)arg)->probe;
    p->commands++;
    char *word = rest ? zmsg_popstr(rest) : NULL; /* the command's other frames */
    snprintf(p->last_command, sizeof p->last_command, "%s %s", cmd, word ? word : "-");
    zstr_free(&word);
    return p->end_on_command && streq(cmd, "END") ? -1 : 0;
}

static void s_term(void *arg)
{
    ((s_state_t *)arg)->probe->terms++;
}

static void s_tick(void *arg)
{
    ((s_state_t *)arg)->probe->ticks++;
}

static void s_stop(void *arg)
{
    s_state_t *self = arg;
    if (self->probe) /* NULL when the state could not even be started */
        self->probe->stops++;
}

static const mq_service_ops_t s_ops = {.name = "probe",
                                       .size = sizeof(s_state_t),
                                       .start = s_start,
                                       .command = s_command,
                                       .term = s_term,
                                       .tick = s_tick,
                                       .stop = s_stop};

static void s_actor(zsock_t *pipe, void *args)
{
    mq_service_actor(pipe, &s_ops, args);
}

/* The next string on the actor's pipe within TIMEOUT_MS, or NULL. */
static char *s_recv(zactor_t *a, int timeout_ms)
{
    zsock_set_rcvtimeo(a, timeout_ms);
    return zstr_recv(a);
}

Test(service, a_started_service_answers_the_pipe_ticks_and_stops_in_order, .timeout = 30)
{
    s_probe_t p = {0};
    zactor_t *a = zactor_new(s_actor, &p);
    cr_assert_not_null(a);
    cr_expect_eq(p.starts, 1, "start ran before zactor_new returned");
    cr_expect(p.zeroed, "the state start saw was not zeroed");
    zstr_send(a, "PORT");
    char *port = s_recv(a, 5000);
    cr_assert_not_null(port);
    cr_expect_str_eq(port, "4242");
    zstr_free(&port);
    zstr_send(a, "DROPS");
    char *drops = s_recv(a, 5000);
    cr_assert_not_null(drops);
    char want[64];
    snprintf(want, sizeof want, "%s=3", mq_drop_name(MQ_DROP_TYPE));
    cr_expect(strstr(drops, want), "DROPS answered '%s', not the service's %s", drops, want);
    zstr_free(&drops);
    zstr_sendx(a, "ECHO", "word", NULL);
    zclock_sleep(1300); /* one tick at least */
    zactor_destroy(&a);
    cr_expect_str_eq(p.last_command, "ECHO word");
    cr_expect_eq(p.commands, 1);
    cr_expect_geq(p.ticks, 1, "no tick in 1.3 s");
    cr_expect_eq(p.terms, 1, "$TERM did not reach the service");
    cr_expect_eq(p.stops, 1);
}

Test(service, a_failed_start_reports_its_code_and_why_and_runs_nothing, .timeout = 30)
{
    s_probe_t p = {.fail = 2};
    zactor_t *a = zactor_new(s_actor, &p);
    cr_assert_not_null(a);
    char *done = s_recv(a, 5000);
    cr_assert_not_null(done, "no DONE after a failed start");
    cr_expect_str_eq(done, "DONE 2 the probe's port is taken");
    zstr_free(&done);
    zstr_send(a, "PORT"); /* still answered, as nothing: the owner may ask before it reads */
    char *port = s_recv(a, 5000);
    cr_assert_not_null(port);
    cr_expect_str_eq(port, "0");
    zstr_free(&port);
    zstr_send(a, "DROPS");
    char *drops = s_recv(a, 5000);
    cr_assert_not_null(drops);
    zstr_free(&drops);
    zstr_send(a, "ECHO"); /* the service's own commands are not: nothing of it runs */
    zclock_sleep(1200);
    zactor_destroy(&a);
    cr_expect_eq(p.commands, 0);
    cr_expect_eq(p.ticks, 0);
    cr_expect_eq(p.terms, 0);
    cr_expect_eq(p.stops, 1, "stop runs after a failed start too (what start opened)");
}

Test(service, a_loop_that_ends_by_itself_reports_a_failure, .timeout = 30)
{
    s_probe_t p = {.end_on_command = true};
    zactor_t *a = zactor_new(s_actor, &p);
    cr_assert_not_null(a);
    zstr_send(a, "END");
    char *done = s_recv(a, 5000);
    cr_assert_not_null(done, "no DONE after the loop ended");
    cr_expect_str_eq(done, "DONE 1 the service's loop ended by itself");
    zstr_free(&done);
    zactor_destroy(&a);
    cr_expect_eq(p.terms, 0);
    cr_expect_eq(p.stops, 1);
}

/* Every service runs on it: a service program that cannot start says why and exits with
 * the start's code (test_front_door runs the programs themselves). */
Test(service, mq_service_run_returns_the_start_code)
{
    s_probe_t p = {.fail = MQ_EXIT_REFUSED};
    cr_expect_eq(mq_service_run(s_actor, &p), MQ_EXIT_REFUSED);
    cr_expect_eq(p.starts, 1);
    cr_expect_eq(p.stops, 1);
}
