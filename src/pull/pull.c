/*
 * pull: one model from the hub into the models directory, with the guarantee that a file under
 * OWNER/NAME/ is complete and verified:
 *   1. the file is picked (a quant is matched against the repo's file list) and its size and sha256 are
 *      read from the hub (HEAD: X-Linked-Size, X-Linked-Etag; the tree listing's lfs.oid as a fallback);
 *   2. it is downloaded into .downloads/SHA256.part, which is locked (flock) against a concurrent pull and
 *      kept across runs, so an interrupted download resumes (Range) where it stopped;
 *   3. size, sha256 and the GGUF magic are checked; a wrong checksum removes the part file (resuming bytes
 *      that are wrong cannot make them right);
 *   4. the part file is fsynced and renamed into place (atomic on one filesystem), then the folder fsynced.
 */
#include "pull/pull.h"

#include "core/err.h"
#include "core/fsutil.h"
#include "pull/progress.h"
#include "pull/sha256.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

void pull_opts_default(struct pull_opts *o)
{
    memset(o, 0, sizeof *o);
    o->retries = -1;
}

/* mkdir -p of the folder that holds path (path's last component is a file). */
static void pull_fsync_dir_of(const char *path)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash)
        *slash = 0;
    int fd = open(slash ? buf : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

struct pull_verify_ctx {
    struct progress prog;
};

static void pull_on_hash(void *ctx, int64_t done) { progress_update(&((struct pull_verify_ctx *)ctx)->prog, done); }

/* Step 1: which file, and its size and sha256. */
static int pull_pick(const struct hub *h, struct hub_spec *spec, struct hub_meta *meta, bool quiet, char *err)
{
    char tree_sha[65] = "";
    if (!spec->file[0]) {
        struct hub_file *files;
        int n;
        int rc = hub_list_files(h, spec->repo, spec->revision, &files, &n, err);
        if (rc)
            return rc;
        const char **paths = malloc(sizeof *paths * (size_t)(n ? n : 1));
        if (!paths) {
            hub_files_free(files, n);
            return err_set(err, ERR_NOMEM, "out of memory");
        }
        for (int i = 0; i < n; i++)
            paths[i] = files[i].path;
        int k = hub_pick_file(spec, paths, n, err);
        if (k >= 0) {
            snprintf(spec->file, sizeof spec->file, "%s", files[k].path);
            snprintf(tree_sha, sizeof tree_sha, "%s", files[k].sha256);
        }
        free(paths);
        hub_files_free(files, n);
        if (k < 0)
            return k;
        if (!quiet)
            fprintf(stderr, "pull: %s%s%s -> %s\n", spec->repo, spec->quant[0] ? ":" : "", spec->quant, spec->file);
    }
    int rc = hub_file_meta(h, spec, meta, err);
    if (rc)
        return rc;
    if (!meta->sha256[0] && tree_sha[0])
        snprintf(meta->sha256, sizeof meta->sha256, "%s", tree_sha);
    else if (meta->sha256[0] && tree_sha[0] && strcmp(meta->sha256, tree_sha))
        return err_set(err, ERR_FORMAT, "%s/%s: the hub gives two checksums (file list %s, X-Linked-Etag %s)",
                       spec->repo, spec->file, tree_sha, meta->sha256);
    return 0;
}

/* The part file's name: the content's sha256, else the ETag, else the repo and path (sanitized). */
static void pull_part_name(const struct hub_spec *spec, const struct hub_meta *meta, char *out, size_t cap)
{
    char src[700];
    if (meta->sha256[0])
        snprintf(src, sizeof src, "%s", meta->sha256);
    else if (meta->etag[0])
        snprintf(src, sizeof src, "etag-%s", meta->etag);
    else
        snprintf(src, sizeof src, "%s@%s-%s", spec->repo, spec->revision, spec->file);
    size_t n = 0;
    for (const char *p = src; *p && n + 6 < cap; p++)
        out[n++] = isalnum((unsigned char)*p) || *p == '-' || *p == '.' || *p == '@' ? *p : '_';
    snprintf(out + n, cap - n, ".part");
}

/* Steps 2-4 for a picked file. */
static int pull_fetch(const struct hub *h, const char *dir, const struct hub_spec *spec,
                      const struct hub_meta *meta, const char *dest, bool quiet, char *err)
{
    char part_name[200], part[4400];
    pull_part_name(spec, meta, part_name, sizeof part_name);
    snprintf(part, sizeof part, "%s/.downloads/%s", dir, part_name);
    int rc = fs_mkdirs_for(part, 0755, err);
    if (rc)
        return rc;
    int fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return err_set(err, ERR_IO, "cannot open %s: %s", part, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        close(fd);
        return err_set(err, ERR_UNAVAILABLE, "another wafer pull is downloading %s/%s right now (%s is locked)",
                       spec->repo, spec->file, part);
    }
    const char *base = strrchr(spec->file, '/');
    base = base ? base + 1 : spec->file;
    if (!quiet) {
        char b[16];
        fprintf(stderr, "pull: %s/%s (%s, sha256 %s) into %s\n", spec->repo, spec->file,
                meta->size >= 0 ? progress_bytes(meta->size, b) : "size unknown",
                meta->sha256[0] ? meta->sha256 : "not given by the hub: size checked only", dir);
    }
    rc = hub_download(h, spec, fd, meta->size, base, err);
    struct stat st;
    if (rc && !fstat(fd, &st) && st.st_size == 0)
        unlink(part); /* nothing arrived: nothing to resume */
    if (!rc && fstat(fd, &st))
        rc = err_set(err, ERR_IO, "cannot stat %s: %s", part, strerror(errno));
    if (!rc && meta->size >= 0 && st.st_size != meta->size)
        rc = err_set(err, ERR_FORMAT, "%s/%s: downloaded %lld bytes, the hub said %lld", spec->repo, spec->file,
                     (long long)st.st_size, (long long)meta->size);
    if (!rc && meta->sha256[0]) {
        struct pull_verify_ctx v;
        char label[512], got[65];
        snprintf(label, sizeof label, "verifying %s", base);
        progress_begin(&v.prog, label, st.st_size, 0, quiet || st.st_size < (64 << 20));
        rc = sha256_file(part, got, pull_on_hash, &v, err);
        if (!rc && st.st_size >= (64 << 20))
            progress_end(&v.prog, NULL);
        if (!rc && strcmp(got, meta->sha256)) {
            unlink(part); /* resuming wrong bytes cannot make them right */
            rc = err_set(err, ERR_FORMAT, "%s/%s: checksum mismatch: the hub says sha256 %s, the download has %s; "
                         "the download was discarded and nothing was installed: run wafer pull again", spec->repo,
                         spec->file, meta->sha256, got);
        }
    }
    if (!rc) {
        char magic[4] = {0};
        if (pread(fd, magic, 4, 0) != 4 || memcmp(magic, "GGUF", 4)) {
            unlink(part);
            rc = err_set(err, ERR_FORMAT, "%s/%s: the download is not a GGUF file (it starts with '%.4s'); it was "
                         "discarded", spec->repo, spec->file, magic);
        }
    }
    if (!rc && fsync(fd))
        rc = err_set(err, ERR_IO, "cannot sync %s: %s", part, strerror(errno));
    if (!rc)
        rc = fs_mkdirs_for(dest, 0755, err);
    if (!rc && rename(part, dest))
        rc = err_set(err, ERR_IO, "cannot move %s to %s: %s", part, dest, strerror(errno));
    if (!rc)
        pull_fsync_dir_of(dest);
    close(fd); /* releases the lock */
    return rc;
}

int pull_model(const char *spec_text, const struct pull_opts *o, char **path_out, bool *fetched, char *err)
{
    *path_out = NULL;
    if (fetched)
        *fetched = false;
    struct hub_spec spec;
    int rc = hub_spec_parse(spec_text, &spec, err);
    if (rc)
        return rc;
    char dir[4096];
    if (o->models_dir)
        snprintf(dir, sizeof dir, "%s", o->models_dir);
    else if ((rc = pull_models_dir(dir, sizeof dir, err)))
        return rc;
    if (!o->force) {
        char msg[ERR_MSG_MAX];
        rc = pull_find_local(dir, &spec, path_out, msg);
        if (rc == 0)
            return 0;
        if (rc != ERR_NOT_FOUND)
            return err_set(err, rc, "%s", msg);
    }
    struct hub h;
    hub_init_from_env(&h);
    h.quiet = o->quiet;
    if (o->retries >= 0)
        h.retries = o->retries;
    struct hub_meta meta;
    if ((rc = pull_pick(&h, &spec, &meta, o->quiet, err)))
        return rc;
    char repo_dir[320];
    if (strcmp(spec.revision, "main"))
        snprintf(repo_dir, sizeof repo_dir, "%s@%s", spec.repo, spec.revision);
    else
        snprintf(repo_dir, sizeof repo_dir, "%s", spec.repo);
    char *dest;
    if (asprintf(&dest, "%s/%s/%s", dir, repo_dir, spec.file) < 0)
        return err_set(err, ERR_NOMEM, "out of memory");
    struct stat st;
    if (!o->force && !stat(dest, &st)) { /* picked on the hub, and that file is already here */
        *path_out = dest;
        return 0;
    }
    rc = pull_fetch(&h, dir, &spec, &meta, dest, o->quiet, err);
    if (rc) {
        free(dest);
        return rc;
    }
    *path_out = dest;
    if (fetched)
        *fetched = true;
    return 0;
}

int pull_resolve_model(const char *model, char **path_out, char *err)
{
    *path_out = NULL;
    if (strncmp(model, "hf://", 5)) {
        if (!(*path_out = strdup(model)))
            return err_set(err, ERR_NOMEM, "out of memory");
        return 0;
    }
    struct pull_opts o;
    pull_opts_default(&o);
    return pull_model(model, &o, path_out, NULL, err);
}
