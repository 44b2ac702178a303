/*
 * version: the version and commit of the running binary, for the endpoints that report them (/health).
 * The Makefile generates them for src/cli/main.c only (so a new commit rebuilds one file), which hands
 * them here at start; until then they read "unknown".
 */
#ifndef WAFER_CORE_VERSION_H
#define WAFER_CORE_VERSION_H

/* Sets both (static strings, not copied). Call once, before any thread starts. */
void version_set(const char *version, const char *commit);
/* The version ("0.1.0") and the git commit, or "unknown". */
const char *version_get(void);
const char *version_commit_get(void);

#endif
