/*
 * fsutil: see fsutil.h. Paths longer than PATH_MAX are refused rather than cut, so a folder is never made
 * under a truncated name.
 */
#include "core/fsutil.h"

#include "core/err.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int fs_mkdirs(const char *dir, unsigned mode, char *err)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return err_set(err, ERR_IO, "cannot create the folder %.64s...: the path is longer than %d bytes", dir,
                       PATH_MAX - 1);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, (mode_t)mode) && errno != EEXIST)
            return err_set(err, ERR_IO, "cannot create the folder %s: %s", buf, strerror(errno));
        *p = c;
        if (!c)
            break;
    }
    return 0;
}

int fs_mkdirs_for(const char *path, unsigned mode, char *err)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return err_set(err, ERR_IO, "cannot create the folder of %.64s...: the path is longer than %d bytes", path,
                       PATH_MAX - 1);
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf)
        return 0;
    *slash = '\0';
    return fs_mkdirs(buf, mode, err);
}
