/*
 * version.c: the library's version string (libdcomm.la's own object; every
 * other object comes from libdcomm_core.la).
 */
#include "config.h"
#include "dcomm.h"

const char *dcomm_version_string(void) { return PACKAGE_VERSION; }
