/*
 * yaml: one libfyaml loader with collected diagnostics (see yaml.h).
 */
#include "core/yaml.h"

#include "core/err.h"

#include <stdlib.h>
#include <string.h>

struct fy_document *yaml_load(const char *path, const char *text, size_t len, const char *name, int *rc,
                              char *err)
{
    struct fy_diag_cfg dcfg;
    fy_diag_cfg_default(&dcfg);
    dcfg.fp = NULL;
    dcfg.colorize = false;
    struct fy_diag *diag = fy_diag_create(&dcfg);
    if (!diag) {
        *rc = err_set(err, ERR_NOMEM, "out of memory creating the YAML parser");
        return NULL;
    }
    fy_diag_set_collect_errors(diag, true);
    struct fy_parse_cfg pcfg = {.search_path = NULL, .flags = FYPCF_QUIET, .userdata = NULL, .diag = diag};
    struct fy_document *doc =
        path ? fy_document_build_from_file(&pcfg, path) : fy_document_build_from_string(&pcfg, text, len);
    *rc = 0;
    if (!doc) {
        void *it = NULL;
        struct fy_diag_error *de = fy_diag_errors_iterate(diag, &it);
        if (de)
            *rc = err_set(err, ERR_FORMAT, "%s:%d:%d: YAML syntax error: %s", name, de->line, de->column,
                          de->msg ? de->msg : "invalid YAML");
        else
            *rc = err_set(err, ERR_FORMAT, "%s: not valid YAML", name);
    }
    fy_diag_destroy(diag);
    return doc;
}

int yaml_scalar_line(struct fy_node *n)
{
    struct fy_token *t = n ? fy_node_get_scalar_token(n) : NULL;
    const struct fy_mark *m = t ? fy_token_start_mark(t) : NULL;
    return m ? m->line + 1 : 0;
}

bool yaml_scalar(struct fy_node *n, char *buf, size_t cap)
{
    if (!n || !fy_node_is_scalar(n) || fy_node_is_alias(n))
        return false;
    size_t len;
    const char *s = fy_node_get_scalar(n, &len);
    if (!s || len >= cap)
        return false;
    memcpy(buf, s, len);
    buf[len] = 0;
    return true;
}

char *yaml_resolve_path(const char *base, const char *p)
{
    if (!base || p[0] == '/')
        return strdup(p);
    const char *slash = strrchr(base, '/');
    if (!slash)
        return strdup(p);
    size_t dl = (size_t)(slash - base) + 1;
    char *r = malloc(dl + strlen(p) + 1);
    if (!r)
        return NULL;
    memcpy(r, base, dl);
    strcpy(r + dl, p);
    return r;
}
