/*
 * tuning.h: the tuning file, DCOMM_* settings measured on this machine
 * (`dcomm-bench --tune FILE` writes one) that stand between the built-in
 * defaults and the environment: a variable that is set wins over the file,
 * the file wins over the default. It is DCOMM_TUNING_FILE, else
 * $(sysconfdir)/dcomm/tuning.conf when that exists; "none" reads no file.
 *
 * These calls are made under param.c's lock (param.c is the only caller
 * besides dcomm-info's report).
 */
#ifndef DCOMM_TUNING_H
#define DCOMM_TUNING_H

/* Reads the file when the path it names differs from the one read before
 * (the first call reads it). 0; DCOMM_EINVAL naming the file and line of a
 * malformed line; DCOMM_ESYSTEM when a file DCOMM_TUNING_FILE names cannot
 * be read. On error no tuning is in force. */
int dcomm__tuning_load(void);

/* The value the file gives the variable name, or NULL. */
const char *dcomm__tuning_value(const char *name);

/* The file in force (NULL: none) and how many settings it gave. */
const char *dcomm__tuning_path(void);
int dcomm__tuning_count(void);

#endif
