/* metrics.csv's lines for the commands that read it (summary, report): split in place at
 * commas, and the header's columns found by name, so runs whose columns were appended to
 * later still read. */
#ifndef MQGRAD_CLI_CSV_H
#define MQGRAD_CLI_CSV_H

/* Splits LINE in place at commas; stores at most MAX cells in CELLS, returns how many there
 * are. */
int mq_csv_split(char *line, char **cells, int max);
/* Splits the header LINE of PATH into a newly allocated *CELLS (free it) of *NCOLS cells;
 * -1 with an error out of memory. */
int mq_csv_header(const char *path, char *line, char ***cells, int *ncols);
/* Where NAME sits among CELLS[0..N) (its first place), or -1. */
int mq_csv_find(char *const *cells, int n, const char *name);

#endif
