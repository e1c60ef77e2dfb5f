/*
 * bench_tune.h: `dcomm-bench --tune FILE`, which measures on the job it
 * runs in the settings whose best value depends on the machine and writes
 * them as a tuning file the library reads (DCOMM_TUNING_FILE).
 */
#ifndef DCOMM_BENCH_TUNE_H
#define DCOMM_BENCH_TUNE_H

/* argv[0] is "--tune", argv[1] the file, then optionally "-e" and the
 * largest size to measure. Joins the job (dcomm_init) once. The exit
 * status: 0, 1 (a dcomm call or the write failed), 2 (usage). */
int bench_tune(int argc, char **argv);

#endif
