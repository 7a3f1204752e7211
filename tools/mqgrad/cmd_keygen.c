/* mqgrad keygen DIR [--operator NAME]: a cluster's CURVE keys (mqgrad/security.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "mqgrad/security.h"
#include "mqgrad/util.h"

int mq_cmd_keygen(int argc, char **argv)
{
    static const char *usage =
        "usage: mqgrad keygen DIR [--operator NAME] [--owner UID:GID]\n"
        "Writes a cluster's keys into DIR: for each of scheduler, server, worker, agent and\n"
        "operator a public certificate DIR/<role>.key and its secret DIR/<role>.key_secret\n"
        "(mode 0600). With --operator NAME, only another operator's DIR/operator-NAME.key*.\n"
        "Give every service the public keys (--keys DIR) and its own role's secret (--key\n"
        "FILE); never a secret of another role. Existing keys are never overwritten.\n"
        "--owner UID:GID gives the services' secrets to that user (the containers' 10001:10001;\n"
        "needs root): the operator's secret stays with whoever ran keygen.";
    const char *dir = NULL, *op = NULL, *owner = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("%s\n", usage);
            return 0;
        }
        if (strcmp(argv[i], "--operator") == 0 && i + 1 < argc) {
            op = argv[++i];
        } else if (strcmp(argv[i], "--owner") == 0 && i + 1 < argc) {
            owner = argv[++i];
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "mqgrad keygen: unexpected argument '%s'\n%s\n", argv[i], usage);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "mqgrad keygen: which directory?\n%s\n", usage);
        return 2;
    }
    unsigned uid = 0, gid = 0;
    char end;
    if (owner && sscanf(owner, "%u:%u%c", &uid, &gid, &end) != 2) {
        fprintf(stderr, "mqgrad keygen: --owner '%s' is not UID:GID\n", owner);
        return 2;
    }
    if (mq_sec_keygen(dir, op) != 0) {
        fprintf(stderr, "mqgrad keygen: %s\n", mq_err_last());
        return 1;
    }
    static const char *services[] = {"scheduler", "server", "worker", "agent"};
    for (int i = 0; owner && !op && i < 4; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.key_secret", dir, services[i]);
        if (chown(path, (uid_t)uid, (gid_t)gid) != 0) {
            fprintf(stderr, "mqgrad keygen: --owner: %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    if (op)
        printf("wrote %s/operator-%s.key and its secret\n", dir, op);
    else
        printf("wrote the keys of scheduler, server, worker, agent and operator to %s\n", dir);
    return 0;
}
