/*
 * models_dir: where pulled models live and the local side of pull (find, list, remove). Nothing here uses
 * the network, so run and serve find a pulled model offline.
 */
#include "pull/pull.h"

#include "core/err.h"
#include "engine/dtype.h"
#include "engine/gguf/ftype.h"
#include "engine/gguf/gguf.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

int pull_models_dir(char *out, size_t cap, char *err)
{
    const char *env = getenv("WAFER_MODELS"), *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
    int n;
    if (env && *env)
        n = snprintf(out, cap, "%s", env);
    else if (xdg && *xdg == '/')
        n = snprintf(out, cap, "%s/wafer/models", xdg);
    else if (home && *home)
        n = snprintf(out, cap, "%s/.local/share/wafer/models", home);
    else
        return err_set(err, ERR_INVALID_ARG, "no models directory: set WAFER_MODELS (or HOME)");
    if (n < 0 || (size_t)n >= cap)
        return err_set(err, ERR_INVALID_ARG, "the models directory path is too long");
    while (n > 1 && out[n - 1] == '/')
        out[--n] = 0;
    return 0;
}

/* "OWNER/NAME" or "OWNER/NAME@REV" */
static void pull_repo_dir(const struct hub_spec *spec, char *out, size_t cap)
{
    if (strcmp(spec->revision, "main"))
        snprintf(out, cap, "%s@%s", spec->repo, spec->revision);
    else
        snprintf(out, cap, "%s", spec->repo);
}

struct pull_names {
    char **v;
    int n, cap;
};

static int pull_names_add(struct pull_names *ns, const char *s)
{
    if (ns->n == ns->cap) {
        int cap = ns->cap ? ns->cap * 2 : 16;
        char **nv = realloc(ns->v, sizeof *nv * (size_t)cap);
        if (!nv)
            return ERR_NOMEM;
        ns->v = nv;
        ns->cap = cap;
    }
    if (!(ns->v[ns->n] = strdup(s)))
        return ERR_NOMEM;
    ns->n++;
    return 0;
}

static void pull_names_free(struct pull_names *ns)
{
    for (int i = 0; i < ns->n; i++)
        free(ns->v[i]);
    free(ns->v);
}

static bool pull_is_gguf(const char *name)
{
    size_t n = strlen(name);
    return n > 5 && !strcasecmp(name + n - 5, ".gguf");
}

/* Relative paths of the .gguf files under root/rel (hidden entries and .downloads skipped), depth-first. */
static int pull_walk(const char *root, const char *rel, struct pull_names *out, int depth)
{
    char path[4096];
    snprintf(path, sizeof path, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT || errno == ENOTDIR ? 0 : ERR_IO;
    int rc = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char sub[4096];
        if (snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", de->d_name) >= (int)sizeof sub)
            continue;
        char full[8200];
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat st;
        if (stat(full, &st))
            continue;
        if (S_ISDIR(st.st_mode) && depth < 16)
            rc = pull_walk(root, sub, out, depth + 1);
        else if (S_ISREG(st.st_mode) && pull_is_gguf(de->d_name))
            rc = pull_names_add(out, sub);
    }
    closedir(d);
    return rc;
}

static int pull_cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int pull_find_local(const char *dir, const struct hub_spec *spec, char **path_out, char *err)
{
    *path_out = NULL;
    char repo_dir[320];
    pull_repo_dir(spec, repo_dir, sizeof repo_dir);
    char *path = NULL;
    if (spec->file[0]) {
        struct stat st;
        if (asprintf(&path, "%s/%s/%s", dir, repo_dir, spec->file) < 0)
            return err_set(err, ERR_NOMEM, "out of memory");
        if (stat(path, &st) || !S_ISREG(st.st_mode)) {
            free(path);
            return ERR_NOT_FOUND;
        }
        *path_out = path;
        return 0;
    }
    char root[4096];
    snprintf(root, sizeof root, "%s/%s", dir, repo_dir);
    struct pull_names ns = {0};
    int rc = pull_walk(root, "", &ns, 0);
    if (rc) {
        pull_names_free(&ns);
        return err_set(err, rc, "cannot read %s", root);
    }
    if (ns.n == 0) {
        pull_names_free(&ns);
        return ERR_NOT_FOUND;
    }
    qsort(ns.v, (size_t)ns.n, sizeof *ns.v, pull_cmp_str);
    char msg[ERR_MSG_MAX];
    int k = hub_pick_file(spec, (const char *const *)ns.v, ns.n, msg);
    if (k >= 0) {
        if (asprintf(&path, "%s/%s", root, ns.v[k]) < 0)
            rc = err_set(err, ERR_NOMEM, "out of memory");
        else
            *path_out = path;
    } else if (k == ERR_INVALID_ARG) { /* several pulled files fit: the user must say which */
        rc = err_set(err, ERR_INVALID_ARG, "in %s: %s", dir, msg);
    } else {
        rc = ERR_NOT_FOUND;
    }
    pull_names_free(&ns);
    return rc;
}

/* llama.cpp's LLAMA_FTYPE_* names of the types wafer does not run (ftype_name has the ones it does), so
 * `wafer list` names every file a user may have pulled. */
static const char *pull_ftype_other(uint32_t ft)
{
    static const char *const names[] = {
        [3] = "q4_1",      [8] = "q5_0",     [9] = "q5_1",    [10] = "q2_k",    [11] = "q3_k_s",
        [12] = "q3_k_m",   [13] = "q3_k_l",  [14] = "q4_k_s", [16] = "q5_k_s",  [17] = "q5_k_m",
        [19] = "iq2_xxs",  [20] = "iq2_xs",  [21] = "q2_k_s", [22] = "iq3_xs",  [23] = "iq3_xxs",
        [24] = "iq1_s",    [25] = "iq4_nl",  [26] = "iq3_s",  [27] = "iq3_m",   [28] = "iq2_s",
        [29] = "iq2_m",    [30] = "iq4_xs",  [31] = "iq1_m",  [36] = "tq1_0",   [37] = "tq2_0",
    };
    return ft < sizeof names / sizeof names[0] ? names[ft] : NULL;
}

static void pull_quant_of(const char *path, char *out, size_t cap)
{
    char err[ERR_MSG_MAX];
    snprintf(out, cap, "?");
    struct gguf *g = gguf_open(path, err);
    if (!g)
        return;
    uint32_t ft;
    if (!gguf_get_u32(g, "general.file_type", &ft)) {
        const char *name = ftype_name((enum ftype)(ft & 0x3ff)); /* 1024 marks a "guessed" type */
        if (!strcmp(name, "unknown"))
            name = pull_ftype_other(ft & 0x3ff);
        if (name)
            snprintf(out, cap, "%s", name);
        else
            snprintf(out, cap, "type %u", ft);
    } else { /* no general.file_type (converted files): the type of most of the weight bytes */
        size_t best = 0;
        for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
            const struct gguf_tensor *t = gguf_tensor_at(g, i);
            if (t->n_dims >= 2 && t->nbytes > best) {
                best = t->nbytes;
                snprintf(out, cap, "%s", dtype_name(t->type));
            }
        }
    }
    gguf_close(g);
}

int pull_list(const char *dir, struct pull_entry **entries, int *n, int64_t *partial_bytes, int *n_partial,
              char *err)
{
    *entries = NULL;
    *n = 0;
    *partial_bytes = 0;
    *n_partial = 0;
    struct pull_names ns = {0};
    int rc = pull_walk(dir, "", &ns, 0);
    if (rc) {
        pull_names_free(&ns);
        return err_set(err, rc, "cannot read the models directory %s: %s", dir, strerror(errno));
    }
    if (ns.n > 1) /* (an empty list has no array: qsort must not see NULL) */
        qsort(ns.v, (size_t)ns.n, sizeof *ns.v, pull_cmp_str);
    struct pull_entry *e = calloc((size_t)(ns.n ? ns.n : 1), sizeof *e);
    if (!e) {
        pull_names_free(&ns);
        return err_set(err, ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < ns.n; i++) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, ns.v[i]);
        struct stat st;
        e[i].name = ns.v[i];
        ns.v[i] = NULL;
        if (!stat(full, &st)) {
            e[i].size = st.st_size;
            e[i].mtime = st.st_mtime;
        }
        pull_quant_of(full, e[i].quant, sizeof e[i].quant);
    }
    *entries = e;
    *n = ns.n;
    pull_names_free(&ns);
    char parts[4096];
    snprintf(parts, sizeof parts, "%s/.downloads", dir);
    DIR *d = opendir(parts);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        struct stat st;
        char full[4400];
        snprintf(full, sizeof full, "%s/%s", parts, de->d_name);
        if (len > 5 && !strcmp(de->d_name + len - 5, ".part") && !stat(full, &st)) {
            (*n_partial)++;
            *partial_bytes += st.st_size;
        }
    }
    if (d)
        closedir(d);
    return 0;
}

void pull_entries_free(struct pull_entry *e, int n)
{
    for (int i = 0; e && i < n; i++)
        free(e[i].name);
    free(e);
}

/* Removes the empty folders from dir/rel's parent up to (not including) dir. */
static void pull_prune(const char *dir, const char *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    size_t root = strlen(dir);
    for (char *slash = strrchr(path, '/'); slash && (size_t)(slash - path) > root; slash = strrchr(path, '/')) {
        *slash = 0;
        if (rmdir(path))
            break;
    }
}

int pull_remove(const char *dir, const char *name, char **removed, char *err)
{
    if (removed)
        *removed = NULL;
    struct pull_entry *es;
    int n, n_part;
    int64_t part_bytes;
    int rc = pull_list(dir, &es, &n, &part_bytes, &n_part, err);
    if (rc)
        return rc;
    const char *rel = NULL;
    char *found = NULL;
    for (int i = 0; i < n; i++)
        if (!strcmp(es[i].name, name))
            rel = es[i].name;
    if (!rel) { /* a spec: OWNER/NAME[:QUANT] or hf://... */
        struct hub_spec spec;
        char msg[ERR_MSG_MAX];
        if (hub_spec_parse(name, &spec, msg)) {
            rc = err_set(err, ERR_NOT_FOUND, "no model '%s' in %s (see wafer list)", name, dir);
        } else {
            rc = pull_find_local(dir, &spec, &found, msg);
            if (rc == ERR_NOT_FOUND)
                rc = err_set(err, ERR_NOT_FOUND, "no model '%s' in %s (see wafer list)", name, dir);
            else if (rc)
                rc = err_set(err, rc, "%s", msg);
            else
                rel = found + strlen(dir) + 1;
        }
    }
    if (!rc) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, rel);
        if (unlink(full)) {
            rc = err_set(err, ERR_IO, "cannot remove %s: %s", full, strerror(errno));
        } else {
            pull_prune(dir, rel);
            if (removed && !(*removed = strdup(full)))
                rc = err_set(err, ERR_NOMEM, "out of memory");
        }
    }
    free(found);
    pull_entries_free(es, n);
    return rc;
}

int pull_remove_partials(const char *dir, int *n_removed, int64_t *bytes, char *err)
{
    *n_removed = 0;
    *bytes = 0;
    char parts[4096];
    snprintf(parts, sizeof parts, "%s/.downloads", dir);
    DIR *d = opendir(parts);
    if (!d)
        return errno == ENOENT ? 0 : err_set(err, ERR_IO, "cannot read %s: %s", parts, strerror(errno));
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len <= 5 || strcmp(de->d_name + len - 5, ".part"))
            continue;
        char full[4400];
        struct stat st;
        snprintf(full, sizeof full, "%s/%s", parts, de->d_name);
        if (stat(full, &st))
            continue;
        if (unlink(full)) {
            rc = err_set(err, ERR_IO, "cannot remove %s: %s", full, strerror(errno));
            break;
        }
        (*n_removed)++;
        *bytes += st.st_size;
    }
    closedir(d);
    return rc;
}
