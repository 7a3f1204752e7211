/* A minimal HTTP/1.0 client for the services' endpoints in tests, and a reader of their
 * metrics. */
#ifndef MQGRAD_TEST_HTTP_H
#define MQGRAD_TEST_HTTP_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The value of the sample LINE_START ("name{labels} ") in metrics TEXT, NAN when absent. */
static inline double test_metric_sample(const char *text, const char *line_start)
{
    size_t n = strlen(line_start);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, line_start, n) == 0)
            return strtod(p + n, NULL);
    return NAN;
}

/* METHOD PATH from 127.0.0.1:PORT, with "Authorization: Bearer TOKEN" when TOKEN is given;
 * returns the status code, BODY gets the body. */
static inline int test_http(int port, const char *token, const char *method, const char *path,
                            char *body, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "HTTP connect");
    char req[512];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: x\r\n%s%s%s\r\n", method, path,
                     token ? "Authorization: Bearer " : "", token ? token : "",
                     token ? "\r\n" : "");
    cr_assert_eq(write(fd, req, (size_t)n), n);
    static char resp[65536];
    size_t got = 0;
    ssize_t r;
    while ((r = read(fd, resp + got, sizeof resp - 1 - got)) > 0)
        got += (size_t)r;
    close(fd);
    resp[got] = '\0';
    int code = 0;
    sscanf(resp, "HTTP/1.%*d %d", &code);
    const char *b = strstr(resp, "\r\n\r\n");
    snprintf(body, cap, "%s", b ? b + 4 : "");
    return code;
}

#endif
