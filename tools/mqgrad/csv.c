/* metrics.csv's lines (csv.h). */
#include "csv.h"

#include <stdlib.h>
#include <string.h>

#include "mqgrad/util.h"

int mq_csv_split(char *line, char **cells, int max)
{
    int n = 0;
    for (char *p = line;; p++) {
        if (n < max)
            cells[n] = p;
        n++;
        if (!(p = strchr(p, ',')))
            return n;
        *p = '\0';
    }
}

int mq_csv_header(const char *path, char *line, char ***cells, int *ncols)
{
    int n = 1;
    for (const char *p = line; (p = strchr(p, ',')); p++)
        n++;
    if (!(*cells = calloc((size_t)n, sizeof **cells))) {
        mq_err_set("%s: out of memory", path);
        return -1;
    }
    *ncols = mq_csv_split(line, *cells, n);
    return 0;
}

int mq_csv_find(char *const *cells, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(cells[i], name) == 0)
            return i;
    return -1;
}
