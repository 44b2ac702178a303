/*
 * hub: the parts of the Hugging Face hub's HTTP API that `wafer pull` uses (the ones huggingface_hub uses):
 *   GET  {endpoint}/api/models/{repo}/tree/{revision}?recursive=true   file list: path, size, lfs.oid (sha256),
 *                                                                      paginated with Link: <...>; rel="next"
 *   HEAD {endpoint}/{repo}/resolve/{revision}/{path}                   metadata: X-Linked-Etag (the sha256 of
 *        an LFS file), X-Linked-Size, ETag, X-Repo-Commit; LFS files answer 302 to a CDN, which is not followed
 *   GET  the same resolve URL, redirects followed, Range: bytes=N-     the bytes (206 when resumed)
 * Errors keep the hub's X-Error-Code / X-Error-Message (RepoNotFound, EntryNotFound, RevisionNotFound,
 * GatedRepo) in the message. HF_ENDPOINT and HF_TOKEN (a Bearer token) are honoured.
 *
 * A spec names what to pull: [hf://]OWNER/NAME[@REVISION][:QUANT] or [hf://]OWNER/NAME[@REVISION]/PATH.gguf.
 */
#ifndef WAFER_PULL_HUB_H
#define WAFER_PULL_HUB_H

#include <stdbool.h>
#include <stdint.h>

struct hub_spec {
    char repo[200];     /* "owner/name" */
    char revision[100]; /* "main" unless @REV was given */
    char file[400];     /* path of the file in the repo; "" when it is to be picked by quant */
    char quant[48];     /* "Q4_K_M" as written; "" when none was given */
};

/* Parses a spec (see above). 0, or ERR_INVALID_ARG with a message that shows the accepted forms. */
int hub_spec_parse(const char *s, struct hub_spec *out, char *err);

/* Whether path (a .gguf file in a repo) is a candidate for quant q: the quantization appears in the file name,
 * case-insensitively, as a whole token (bounded by non-alphanumeric characters other than '_', so Q4_K does
 * not match Q4_K_M and F16 does not match BF16). */
bool hub_quant_matches(const char *path, const char *quant);

/* Picks the file for a spec among the paths of a repo (only .gguf files count; mmproj projectors and parts
 * of split models are left out). With no quant: the only GGUF, else the Q4_K_M one (llama.cpp's default).
 * Returns the index in paths, or ERR_NOT_FOUND (none matches) / ERR_INVALID_ARG (ambiguous) with a message
 * that lists the candidates. */
int hub_pick_file(const struct hub_spec *spec, const char *const *paths, int n, char *err);

/* The endpoint and token of a session ($HF_ENDPOINT, default https://huggingface.co; $HF_TOKEN). */
struct hub {
    char endpoint[256]; /* without a trailing slash */
    char token[256];    /* "" when none */
    bool quiet;         /* no progress bar */
    int retries;        /* attempts after the first for a broken transfer (default 5) */
};
void hub_init_from_env(struct hub *h);

struct hub_file {
    char *path;
    int64_t size;
    char sha256[65]; /* "" when not an LFS file */
};
/* The repo's files at a revision. *files (caller frees with hub_files_free) and *n. 0 or a negative code
 * (ERR_AUTH, ERR_NOT_FOUND, ERR_IO, ...) with a message. */
int hub_list_files(const struct hub *h, const char *repo, const char *revision, struct hub_file **files, int *n,
                   char *err);
void hub_files_free(struct hub_file *files, int n);

struct hub_meta {
    int64_t size;    /* X-Linked-Size or Content-Length; -1 unknown */
    char sha256[65]; /* from X-Linked-Etag (LFS), "" when the hub gave none */
    char etag[100];  /* the ETag (a git blob id for a non-LFS file) */
    char commit[64]; /* X-Repo-Commit */
};
/* HEAD of a file: size and checksum before the download starts. 0 or a negative code with a message. */
int hub_file_meta(const struct hub *h, const struct hub_spec *spec, struct hub_meta *m, char *err);

/* Downloads the spec's file into the open part file fd (the caller holds its lock), resuming from its
 * current length with a Range request and retrying a broken transfer up to h->retries times (each retry
 * resumes; 429 and 5xx wait as Retry-After says). size: the file's length from hub_file_meta (-1 unknown).
 * Leaves the part file complete on success and whatever arrived on failure. 0 or a negative code with a
 * message. */
int hub_download(const struct hub *h, const struct hub_spec *spec, int fd, int64_t size, const char *label,
                 char *err);

#endif
