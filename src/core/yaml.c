/*
 * yaml: one libfyaml loader with collected diagnostics (see yaml.h).
 */
#include "core/yaml.h"

#include "core/err.h"

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
