/*
 * fsutil: file-system chores more than one layer needs, done one way: making the folders a file is written
 * into (the jobs store's data dir, pulled models, the tune file).
 */
#ifndef WAFER_CORE_FSUTIL_H
#define WAFER_CORE_FSUTIL_H

/* mkdir -p: makes dir and each missing folder above it with mode (folders that exist are left as they are).
 * 0, or ERR_IO with "cannot create the folder F: reason" in err (ERR_MSG_MAX bytes), F the one that failed. */
int fs_mkdirs(const char *dir, unsigned mode, char *err);

/* fs_mkdirs of the folder that holds the file path (nothing to do when path has no '/' past its first byte). */
int fs_mkdirs_for(const char *path, unsigned mode, char *err);

#endif
