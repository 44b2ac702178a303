/*
 * version: two pointers set once by main before threads start, read by everyone after (no lock needed).
 */
#include "core/version.h"

static const char *version_str = "unknown";
static const char *version_commit = "unknown";

void version_set(const char *version, const char *commit)
{
    version_str = version;
    version_commit = commit;
}

const char *version_get(void) { return version_str; }

const char *version_commit_get(void) { return version_commit; }
