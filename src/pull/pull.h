/*
 * pull: models from the Hugging Face hub in a local models directory, and the directory itself.
 *
 * Layout of the models directory ($WAFER_MODELS, else $XDG_DATA_HOME/wafer/models, else
 * ~/.local/share/wafer/models):
 *   OWNER/NAME/PATH.gguf            a pulled file, at its path in the repo (revision main)
 *   OWNER/NAME@REV/PATH.gguf        the same at another revision
 *   .downloads/SHA256.part          a download in progress or interrupted (resumed by the next pull of the
 *                                   same bytes; named by content, so a new revision never resumes old bytes)
 * A file appears under OWNER/NAME only complete and verified: it is downloaded into .downloads/, checked
 * (size, sha256, GGUF magic), then renamed into place.
 */
#ifndef WAFER_PULL_PULL_H
#define WAFER_PULL_PULL_H

#include "pull/hub.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* The models directory (see above) into out. 0, or ERR_INVALID_ARG when neither $WAFER_MODELS nor $HOME
 * is set. */
int pull_models_dir(char *out, size_t cap, char *err);

struct pull_opts {
    const char *models_dir; /* NULL: pull_models_dir */
    bool quiet;             /* no progress bar and no notes on stderr */
    bool force;             /* download again even when the file is already there */
    int retries;            /* retries of a broken transfer (-1: the default, 5) */
};
void pull_opts_default(struct pull_opts *o);

/* Makes sure the spec's file (hub_spec_parse) is in the models directory: a file already there is used as
 * is (unless force), else it is picked on the hub, downloaded, verified and installed. *path_out gets the
 * local path (caller frees); *fetched (may be NULL) whether it was downloaded now. 0 or a negative code
 * with a message. */
int pull_model(const char *spec, const struct pull_opts *o, char **path_out, bool *fetched, char *err);

/* The model argument of run and serve: "hf://SPEC" becomes a local path, pulled first when it is missing
 * (progress on stderr); anything else is a path and is returned as is. *path_out: caller frees. */
int pull_resolve_model(const char *model, char **path_out, char *err);

/* The spec's file in the models directory, without the network: 0 and *path_out (caller frees), or
 * ERR_NOT_FOUND, or ERR_INVALID_ARG when several files match (message lists them). */
int pull_find_local(const char *dir, const struct hub_spec *spec, char **path_out, char *err);

struct pull_entry {
    char *name;     /* path relative to the models directory, "OWNER/NAME/FILE.gguf" */
    int64_t size;
    char quant[24]; /* from the GGUF's general.file_type ("q4_k_m"), else the type of its largest weight
                     * tensor ("f32"), else "?" (not a readable GGUF) */
    time_t mtime;
};
/* The models in dir, sorted by name; *partial_bytes and *n_partial: the interrupted downloads. Caller
 * frees with pull_entries_free. A missing directory is an empty list. */
int pull_list(const char *dir, struct pull_entry **entries, int *n, int64_t *partial_bytes, int *n_partial,
              char *err);
void pull_entries_free(struct pull_entry *e, int n);

/* Removes one model: name is an entry's name, or a spec that names one pulled file (OWNER/NAME:QUANT,
 * hf://...). Empty folders left behind go too. *removed (caller frees, may be NULL): the path removed. */
int pull_remove(const char *dir, const char *name, char **removed, char *err);
/* Removes the interrupted downloads; *n_removed of them. */
int pull_remove_partials(const char *dir, int *n_removed, int64_t *bytes, char *err);

#endif
