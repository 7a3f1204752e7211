/* mqgrad keygen DIR [--operator NAME]: a cluster's CURVE keys (mqgrad/security.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "mqgrad/security.h"
#include "mqgrad/service.h"
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
    char op[64] = "", owner[32] = "";
    char *pos[1], *args[argc + 1];
    int npos = 0;
    const mq_flag_t flags[] = {
        {"operator", NULL, MQ_FLAG_STR, op, sizeof op, 1, 0,
         "only another operator's keys, DIR/operator-NAME.key*"},
        {"owner", NULL, MQ_FLAG_STR, owner, sizeof owner, 1, 0,
         "UID:GID that gets the services' secrets"},
        {0},
    };
    memcpy(args, argv, sizeof(char *) * (size_t)argc);
    args[0] = "mqgrad keygen";
    args[argc] = NULL;
    int rc = mq_flags_parse(flags, argc, args, usage, pos, 1, &npos);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (npos == 0) {
        fprintf(stderr, "mqgrad keygen: which directory? (see --help)\n");
        return 2;
    }
    const char *dir = pos[0];
    unsigned uid = 0, gid = 0;
    char end;
    if (owner[0] && sscanf(owner, "%u:%u%c", &uid, &gid, &end) != 2) {
        fprintf(stderr, "mqgrad keygen: --owner '%s' is not UID:GID\n", owner);
        return 2;
    }
    if (mq_sec_keygen(dir, op[0] ? op : NULL) != 0) {
        fprintf(stderr, "mqgrad keygen: %s\n", mq_err_last());
        return 1;
    }
    static const char *services[] = {"scheduler", "server", "worker", "agent"};
    for (int i = 0; owner[0] && !op[0] && i < 4; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.key_secret", dir, services[i]);
        if (chown(path, (uid_t)uid, (gid_t)gid) != 0) {
            fprintf(stderr, "mqgrad keygen: --owner: %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    if (op[0])
        printf("wrote %s/operator-%s.key and its secret\n", dir, op);
    else
        printf("wrote the keys of scheduler, server, worker, agent and operator to %s\n", dir);
    return 0;
}
