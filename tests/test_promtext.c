/* Tests of the Prometheus text reader behind `mqgrad top`: names, labels and their escapes,
 * the special values, timestamps, the format's optional blanks, commas and line endings;
 * malformed lines skipped and counted without disturbing their neighbours; lookups by label
 * subsets; and labels that still point right after the arrays have grown many times. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "promtext.h"

static mq_promtext_t s_parse(const char *text)
{
    mq_promtext_t p;
    cr_assert_eq(mq_promtext_parse(text, strlen(text), &p), 0);
    return p;
}

Test(promtext, samples_comments_and_blank_lines)
{
    mq_promtext_t p = s_parse("# HELP mqgrad_scheduler_iteration last finished iteration\n"
                              "# TYPE mqgrad_scheduler_iteration gauge\n"
                              "mqgrad_scheduler_iteration 412\n"
                              "\n"
                              "   \t\n"
                              "  # an indented comment\n"
                              "# EOF\n"
                              "mqgrad_scheduler_loss 0.9779\n");
    cr_assert_eq(p.n, 2);
    cr_assert_eq(p.bad, 0);
    cr_assert_str_eq(p.samples[0].name, "mqgrad_scheduler_iteration");
    cr_assert_eq(p.samples[0].value, 412);
    cr_assert_eq(p.samples[0].nlabels, 0);
    cr_assert_null(p.samples[0].labels);
    cr_assert_not(p.samples[0].has_timestamp);
    cr_assert_str_eq(p.samples[1].name, "mqgrad_scheduler_loss");
    cr_assert_float_eq(p.samples[1].value, 0.9779, 1e-12);
    mq_promtext_free(&p);
}

Test(promtext, labels_and_escapes)
{
    mq_promtext_t p = s_parse(
        "mqgrad_scheduler_worker_seconds{rank=\"0\",phase=\"compute\"} 0.1402\n"
        "m{path=\"C:\\\\dir\\\\\",say=\"\\\"hi\\\"\\nbye\",empty=\"\"} 1\n"
        "m{brace=\"}{,=\"} 2\n");
    cr_assert_eq(p.n, 3);
    cr_assert_eq(p.bad, 0, "%s", p.bad_why);
    const mq_promtext_sample_t *s = &p.samples[0];
    cr_assert_eq(s->nlabels, 2);
    cr_assert_str_eq(s->labels[0].name, "rank");
    cr_assert_str_eq(s->labels[0].value, "0");
    cr_assert_str_eq(mq_promtext_label(s, "phase"), "compute");
    cr_assert_null(mq_promtext_label(s, "reason"));
    s = &p.samples[1];
    cr_assert_str_eq(s->name, "m");
    cr_assert_str_eq(mq_promtext_label(s, "path"), "C:\\dir\\");
    cr_assert_str_eq(mq_promtext_label(s, "say"), "\"hi\"\nbye");
    cr_assert_str_eq(mq_promtext_label(s, "empty"), "");
    cr_assert_str_eq(mq_promtext_label(&p.samples[2], "brace"), "}{,=");
    mq_promtext_free(&p);
}

Test(promtext, special_values)
{
    mq_promtext_t p = s_parse("a NaN\nb +Inf\nc -Inf\nd Inf\ne 1e-3\nf -0\ng 1.5E+10\n"
                              "h nan\ni 18446744073709551616\n");
    cr_assert_eq(p.n, 9);
    cr_assert(isnan(p.samples[0].value));
    cr_assert(isinf(p.samples[1].value) && p.samples[1].value > 0);
    cr_assert(isinf(p.samples[2].value) && p.samples[2].value < 0);
    cr_assert(isinf(p.samples[3].value) && p.samples[3].value > 0);
    cr_assert_float_eq(p.samples[4].value, 1e-3, 1e-18);
    cr_assert(p.samples[5].value == 0 && signbit(p.samples[5].value));
    cr_assert_eq(p.samples[6].value, 1.5e10);
    cr_assert(isnan(p.samples[7].value));
    cr_assert_eq(p.samples[8].value, 18446744073709551616.0);
    mq_promtext_free(&p);
}

Test(promtext, timestamps)
{
    mq_promtext_t p = s_parse("a 1 1700000000123\nb{x=\"y\"} 2 -5\nc 3\n");
    cr_assert_eq(p.n, 3);
    cr_assert(p.samples[0].has_timestamp);
    cr_assert_eq(p.samples[0].timestamp_ms, 1700000000123LL);
    cr_assert(p.samples[1].has_timestamp);
    cr_assert_eq(p.samples[1].timestamp_ms, -5);
    cr_assert_not(p.samples[2].has_timestamp);
    mq_promtext_free(&p);
}

/* Blanks around every token, a trailing comma, an empty label set, tabs, CRLF, no final
 * newline: all in the format, all read. */
Test(promtext, optional_syntax)
{
    mq_promtext_t p = s_parse("a{ x = \"1\" , y=\"2\", } 7\r\n"
                              "b{} 8\t \r\n"
                              "\tc\t9\t1000\n"
                              "ns:sub:name_total 10");
    cr_assert_eq(p.bad, 0, "line %d: %s", p.bad_line, p.bad_why);
    cr_assert_eq(p.n, 4);
    cr_assert_eq(p.samples[0].nlabels, 2);
    cr_assert_str_eq(mq_promtext_label(&p.samples[0], "x"), "1");
    cr_assert_str_eq(mq_promtext_label(&p.samples[0], "y"), "2");
    cr_assert_eq(p.samples[0].value, 7);
    cr_assert_str_eq(p.samples[1].name, "b");
    cr_assert_eq(p.samples[1].nlabels, 0);
    cr_assert_eq(p.samples[1].value, 8);
    cr_assert_str_eq(p.samples[2].name, "c");
    cr_assert_eq(p.samples[2].timestamp_ms, 1000);
    cr_assert_str_eq(p.samples[3].name, "ns:sub:name_total");
    cr_assert_eq(p.samples[3].value, 10);
    mq_promtext_free(&p);
}

/* Each malformed line is skipped; the first one's number and reason are kept; the good
 * lines around them, and their labels, are untouched. */
Test(promtext, malformed_lines_are_skipped)
{
    static const char *bad[] = {
        "m{a=\"1\" 2",          /* no closing brace */
        "m{a=1} 2",             /* unquoted value */
        "m{a=\"1} 2",           /* unclosed quote */
        "m{a=\"\\t\"} 2",       /* unknown escape */
        "m{1a=\"x\"} 2",        /* label name starts with a digit */
        "m{a:b=\"x\"} 2",       /* colon in a label name */
        "m{a\"x\"} 2",          /* no '=' */
        "m{a=\"x\" b=\"y\"} 2", /* no comma */
        "m",                    /* no value */
        "m{a=\"x\"}",           /* no value after labels */
        "m abc",                /* not a number */
        "m 1 2 3",              /* text after the timestamp */
        "m 1 1.5",              /* timestamp not an integer */
        "9m 1",                 /* name starts with a digit */
        "m-x 1",                /* bad character in a name */
        "{a=\"x\"} 1",          /* no name */
    };
    size_t nbad = sizeof bad / sizeof bad[0];
    char text[4096] = "first{k=\"v\"} 1\n";
    for (size_t i = 0; i < nbad; i++) {
        strcat(text, bad[i]);
        strcat(text, "\n");
    }
    strcat(text, "last{k=\"w\",j=\"z\"} 2\n");
    mq_promtext_t p = s_parse(text);
    cr_assert_eq(p.bad, (int)nbad);
    cr_assert_eq(p.bad_line, 2);
    cr_assert_str_eq(p.bad_why, "expected ',' or '}' after a label");
    cr_assert_eq(p.n, 2);
    cr_assert_str_eq(p.samples[0].name, "first");
    cr_assert_str_eq(mq_promtext_label(&p.samples[0], "k"), "v");
    cr_assert_str_eq(p.samples[1].name, "last");
    cr_assert_eq(p.samples[1].nlabels, 2);
    cr_assert_str_eq(mq_promtext_label(&p.samples[1], "k"), "w");
    cr_assert_str_eq(mq_promtext_label(&p.samples[1], "j"), "z");
    cr_assert_eq(p.samples[1].value, 2);
    mq_promtext_free(&p);

    /* Each on its own says why. */
    for (size_t i = 0; i < nbad; i++) {
        p = s_parse(bad[i]);
        cr_assert_eq(p.n, 0, "'%s' was read", bad[i]);
        cr_assert_eq(p.bad, 1, "'%s'", bad[i]);
        cr_assert_eq(p.bad_line, 1);
        cr_assert(p.bad_why[0], "'%s': no reason", bad[i]);
        mq_promtext_free(&p);
    }
}

Test(promtext, find_by_label_subset)
{
    mq_promtext_t p =
        s_parse("w{rank=\"0\",phase=\"compute\"} 1\n"
                "w{rank=\"0\",phase=\"wait\"} 2\n"
                "w{rank=\"1\",phase=\"wait\"} 3\n"
                "drops{reason=\"bad_token\"} 4\n"
                "plain 5\n");
    const mq_promtext_sample_t *s = mq_promtext_find(&p, "w", "rank", "1", "phase", "wait", NULL);
    cr_assert_not_null(s);
    cr_assert_eq(s->value, 3);
    s = mq_promtext_find(&p, "w", "phase", "wait", NULL);
    cr_assert_eq(s->value, 2, "the first match, in text order");
    s = mq_promtext_find(&p, "w", NULL);
    cr_assert_eq(s->value, 1);
    cr_assert_null(mq_promtext_find(&p, "w", "rank", "2", NULL));
    cr_assert_null(mq_promtext_find(&p, "w", "rank", "0", "phase", "decode", NULL));
    cr_assert_null(mq_promtext_find(&p, "plain", "rank", "0", NULL), "it has no labels");
    cr_assert_null(mq_promtext_find(&p, "missing", NULL));
    cr_assert_eq(mq_promtext_find(&p, "plain", NULL)->value, 5);
    cr_assert_eq(mq_promtext_find(&p, "drops", "reason", "bad_token", NULL)->value, 4);
    mq_promtext_free(&p);
}

/* LEN bounds the text (it need not end in a NUL); a NUL inside a label value spoils only its
 * line; empty text is no samples. */
Test(promtext, length_and_nul)
{
    mq_promtext_t p;
    cr_assert_eq(mq_promtext_parse("a 1\nb 2\n", 4, &p), 0);
    cr_assert_eq(p.n, 1);
    cr_assert_str_eq(p.samples[0].name, "a");
    mq_promtext_free(&p);

    static const char nul[] = "a{x=\"1\0\"} 1\nb 2\n";
    cr_assert_eq(mq_promtext_parse(nul, sizeof nul - 1, &p), 0);
    cr_assert_eq(p.n, 1);
    cr_assert_str_eq(p.samples[0].name, "b");
    cr_assert_eq(p.bad, 1);
    mq_promtext_free(&p);

    cr_assert_eq(mq_promtext_parse("", 0, &p), 0);
    cr_assert_eq(p.n, 0);
    cr_assert_eq(p.bad, 0);
    mq_promtext_free(&p);
    mq_promtext_free(&p); /* twice is harmless */
}

/* Thousands of samples with labels: the arrays move many times while growing, and every
 * sample must still see its own labels afterwards. */
Test(promtext, many_samples_keep_their_labels)
{
    enum { N = 20000 };
    size_t cap = (size_t)N * 64;
    char *text = malloc(cap);
    size_t len = 0;
    for (int i = 0; i < N; i++)
        len += (size_t)snprintf(text + len, cap - len,
                                i % 3 ? "w{rank=\"%d\",phase=\"p%d\"} %d\n" : "x_%d %d\n", i,
                                i % 3 ? i * 2 : i, i);
    mq_promtext_t p;
    cr_assert_eq(mq_promtext_parse(text, len, &p), 0);
    free(text);
    cr_assert_eq(p.n, N);
    for (int i = 0; i < N; i++) {
        const mq_promtext_sample_t *s = &p.samples[i];
        cr_assert_eq(s->value, i);
        if (i % 3 == 0) {
            cr_assert_eq(s->nlabels, 0);
            continue;
        }
        char want[32];
        snprintf(want, sizeof want, "%d", i);
        cr_assert_str_eq(mq_promtext_label(s, "rank"), want);
        snprintf(want, sizeof want, "p%d", i * 2);
        cr_assert_str_eq(mq_promtext_label(s, "phase"), want);
    }
    mq_promtext_free(&p);
}

/* A whole scheduler exposition as the spec names it, histogram included. */
Test(promtext, scheduler_exposition)
{
    mq_promtext_t p = s_parse(
        "# HELP mqgrad_build_info Which mqgrad this is.\n"
        "# TYPE mqgrad_build_info gauge\n"
        "mqgrad_build_info{role=\"scheduler\",version=\"0.1.0\"} 1\n"
        "# TYPE mqgrad_scheduler_test_accuracy_ratio gauge\n"
        "mqgrad_scheduler_test_accuracy_ratio NaN\n"
        "# TYPE mqgrad_scheduler_iteration_seconds histogram\n"
        "mqgrad_scheduler_iteration_seconds_bucket{le=\"0.1\"} 3\n"
        "mqgrad_scheduler_iteration_seconds_bucket{le=\"+Inf\"} 10\n"
        "mqgrad_scheduler_iteration_seconds_sum 2.14\n"
        "mqgrad_scheduler_iteration_seconds_count 10\n"
        "mqgrad_scheduler_dropped_messages_total{reason=\"malformed\"} 0\n");
    cr_assert_eq(p.n, 7);
    cr_assert_eq(p.bad, 0);
    cr_assert_str_eq(
        mq_promtext_label(mq_promtext_find(&p, "mqgrad_build_info", "role", "scheduler", NULL),
                          "version"),
        "0.1.0");
    cr_assert(isnan(mq_promtext_find(&p, "mqgrad_scheduler_test_accuracy_ratio", NULL)->value));
    cr_assert_eq(
        mq_promtext_find(&p, "mqgrad_scheduler_iteration_seconds_bucket", "le", "+Inf", NULL)
            ->value,
        10);
    cr_assert_float_eq(mq_promtext_find(&p, "mqgrad_scheduler_iteration_seconds_sum", NULL)->value,
                       2.14, 1e-12);
    mq_promtext_free(&p);
}
