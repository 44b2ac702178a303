/*
 * hub: spec parsing, file picking and the hub's HTTP endpoints over libcurl (easy handles, one request at a
 * time: a pull is one file).
 *
 * Why the download GETs the resolve URL again on every attempt instead of keeping the CDN URL of the first
 * redirect: the hub's CDN URLs are signed and expire, and a resume may come hours later (another run).
 * curl drops the Authorization header when a redirect leaves the hub's host, so the token never reaches
 * the CDN.
 */
#include "pull/hub.h"

#include "core/err.h"
#include "core/log.h"
#include "pull/progress.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- specs */

static bool hub_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 96 || (n <= 2 && s[0] == '.'))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.')
            return false;
    return true;
}

static bool hub_has_suffix_ci(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcasecmp(s + n - m, suffix);
}

/* A path inside a repo: relative, no empty, "." or ".." segments (it becomes a path under the models
 * directory). */
static bool hub_path_ok(const char *p)
{
    if (!*p || *p == '/')
        return false;
    for (const char *seg = p; seg;) {
        const char *end = strchr(seg, '/');
        size_t n = end ? (size_t)(end - seg) : strlen(seg);
        if (n == 0 || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
            return false;
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)seg[i] < 0x20 || seg[i] == '\\')
                return false;
        seg = end ? end + 1 : NULL;
    }
    return true;
}

int hub_spec_parse(const char *s, struct hub_spec *out, char *err)
{
    memset(out, 0, sizeof *out);
    const char *forms = "expected OWNER/NAME, OWNER/NAME:QUANT (e.g. :Q4_K_M) or OWNER/NAME/FILE.gguf, optionally "
                        "with hf:// before and @REVISION after NAME";
    const char *in = s;
    if (!strncmp(s, "hf://", 5))
        s += 5;
    const char *slash = strchr(s, '/');
    if (!slash || !hub_name_ok(s, (size_t)(slash - s)))
        return err_set(err, ERR_INVALID_ARG, "'%s': %s", in, forms);
    const char *name = slash + 1;
    size_t nlen = strcspn(name, "/:@");
    if (!hub_name_ok(name, nlen))
        return err_set(err, ERR_INVALID_ARG, "'%s': %s", in, forms);
    snprintf(out->repo, sizeof out->repo, "%.*s", (int)(name + nlen - s), s);
    const char *rest = name + nlen;
    snprintf(out->revision, sizeof out->revision, "main");
    if (*rest == '@') {
        size_t rlen = strcspn(rest + 1, "/:");
        if (rlen == 0 || rlen >= sizeof out->revision)
            return err_set(err, ERR_INVALID_ARG, "'%s': empty or too long revision after '@'", in);
        for (size_t i = 1; i <= rlen; i++)
            if (!isalnum((unsigned char)rest[i]) && !strchr("-_.", rest[i]))
                return err_set(err, ERR_INVALID_ARG, "'%s': bad character '%c' in the revision", in, rest[i]);
        snprintf(out->revision, sizeof out->revision, "%.*s", (int)rlen, rest + 1);
        rest += 1 + rlen;
    }
    if (*rest == ':') {
        const char *q = rest + 1;
        size_t qlen = strlen(q);
        if (qlen == 0 || qlen >= sizeof out->quant)
            return err_set(err, ERR_INVALID_ARG, "'%s': empty or too long quantization after ':'", in);
        for (size_t i = 0; i < qlen; i++)
            if (!isalnum((unsigned char)q[i]) && q[i] != '_' && q[i] != '-')
                return err_set(err, ERR_INVALID_ARG, "'%s': bad character '%c' in the quantization (e.g. Q4_K_M)",
                               in, q[i]);
        snprintf(out->quant, sizeof out->quant, "%s", q);
    } else if (*rest == '/') {
        const char *f = rest + 1;
        if (!hub_path_ok(f) || strlen(f) >= sizeof out->file || !hub_has_suffix_ci(f, ".gguf"))
            return err_set(err, ERR_INVALID_ARG, "'%s': the file must be a relative path in the repo ending in .gguf",
                           in);
        snprintf(out->file, sizeof out->file, "%s", f);
    } else if (*rest) {
        return err_set(err, ERR_INVALID_ARG, "'%s': %s", in, forms);
    }
    return 0;
}

static bool hub_tok_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

bool hub_quant_matches(const char *path, const char *quant)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base), q = strlen(quant);
    if (hub_has_suffix_ci(base, ".gguf"))
        n -= 5;
    if (q == 0 || q > n)
        return false;
    for (size_t i = 0; i + q <= n; i++)
        if (!strncasecmp(base + i, quant, q) && (i == 0 || !hub_tok_char(base[i - 1])) &&
            (i + q == n || !hub_tok_char(base[i + q])))
            return true;
    return false;
}

/* "-00001-of-00003.gguf": one part of a model split by gguf-split. */
static bool hub_is_split_part(const char *path)
{
    size_t n = strlen(path);
    if (n < 20)
        return false;
    const char *t = path + n - 20; /* "-NNNNN-of-NNNNN.gguf" */
    for (int i = 0; i < 20; i++) {
        char c = "-#####-of-#####.gguf"[i];
        if (c == '#' ? !isdigit((unsigned char)t[i]) : tolower((unsigned char)t[i]) != c)
            return false;
    }
    return true;
}

static bool hub_is_model_gguf(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return hub_has_suffix_ci(path, ".gguf") && strncasecmp(base, "mmproj", 6) && !hub_is_split_part(path);
}

/* ", a, b, c" (the first max) into buf */
static void hub_list_names(char *buf, size_t cap, const char *const *paths, const int *idx, int n)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len + 4 < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", paths[idx[i]]);
        if (w < 0 || (size_t)w >= cap - len) {
            snprintf(buf + (cap > 5 ? cap - 5 : 0), 5, "...");
            return;
        }
        len += (size_t)w;
    }
}

int hub_pick_file(const struct hub_spec *spec, const char *const *paths, int n, char *err)
{
    int *all = calloc((size_t)(n > 0 ? n : 1), sizeof(int)), *hit = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    if (!all || !hit) {
        free(all);
        free(hit);
        return err_set(err, ERR_NOMEM, "out of memory");
    }
    int n_all = 0, n_hit = 0, n_split = 0, rc;
    const char *quant = spec->quant[0] ? spec->quant : NULL;
    for (int i = 0; i < n; i++) {
        if (hub_is_model_gguf(paths[i])) {
            all[n_all++] = i;
            if (quant && hub_quant_matches(paths[i], quant))
                hit[n_hit++] = i;
        } else if (hub_is_split_part(paths[i]) && quant && hub_quant_matches(paths[i], quant)) {
            n_split++;
        }
    }
    char names[ERR_MSG_MAX / 2];
    if (!quant && n_all == 1) {
        rc = all[0];
    } else if (!quant) {
        for (int i = 0; i < n_all; i++)
            if (hub_quant_matches(paths[all[i]], "Q4_K_M"))
                hit[n_hit++] = all[i];
        hub_list_names(names, sizeof names, paths, all, n_all);
        if (n_hit == 1)
            rc = hit[0];
        else if (n_all == 0)
            rc = err_set(err, ERR_NOT_FOUND, "%s has no GGUF file", spec->repo);
        else
            rc = err_set(err, ERR_INVALID_ARG, "%s has %d GGUF files: name one with :QUANT or /FILE.gguf (%s)",
                         spec->repo, n_all, names);
    } else if (n_hit == 1) {
        rc = hit[0];
    } else if (n_hit > 1) {
        hub_list_names(names, sizeof names, paths, hit, n_hit);
        rc = err_set(err, ERR_INVALID_ARG, "%s: %d GGUF files match '%s': name one with /FILE.gguf (%s)", spec->repo,
                     n_hit, quant, names);
    } else if (n_split) {
        rc = err_set(err, ERR_UNSUPPORTED, "%s: the '%s' model is split into parts (-00001-of-...), which wafer "
                     "does not load; merge them with llama-gguf-split --merge", spec->repo, quant);
    } else {
        hub_list_names(names, sizeof names, paths, all, n_all);
        rc = err_set(err, ERR_NOT_FOUND, "%s has no GGUF file for '%s'%s%s", spec->repo, quant,
                     n_all ? "; it has: " : " (it has no GGUF file at all)", names);
    }
    free(all);
    free(hit);
    return rc;
}

/* ---------------------------------------------------------------- HTTP */

void hub_init_from_env(struct hub *h)
{
    memset(h, 0, sizeof *h);
    const char *ep = getenv("HF_ENDPOINT"), *tok = getenv("HF_TOKEN");
    snprintf(h->endpoint, sizeof h->endpoint, "%s", ep && *ep ? ep : "https://huggingface.co");
    size_t n = strlen(h->endpoint);
    while (n && h->endpoint[n - 1] == '/')
        h->endpoint[--n] = 0;
    snprintf(h->token, sizeof h->token, "%s", tok ? tok : "");
    h->retries = 5;
}

static pthread_once_t hub_curl_once = PTHREAD_ONCE_INIT;
static void hub_curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* What one request saw. Header fields are those of the last response in a redirect chain (reset at each
 * status line), except linked_* which the hub sends only on its own (first) response. */
struct hub_http {
    CURL *curl;
    struct curl_slist *headers;
    char curl_err[CURL_ERROR_SIZE];
    long status;
    char linked_etag[100], linked_size[32], etag[100], content_length[32], content_range[80], location[1024];
    char error_code[64], error_message[256], repo_commit[64], retry_after[32], link_next[1024];
    char *body; /* response body (JSON listings, error pages), capped at body_cap */
    size_t body_len, body_cap;
    /* downloads: the part file */
    int fd;
    int64_t have;   /* bytes in the part file */
    int64_t range_start; /* start of a 206's Content-Range; -1 none */
    bool started;   /* the first body byte of the final response arrived */
    bool bad_range; /* 206 for another offset than asked */
    bool write_failed;
    int write_errno;
    struct progress *prog;
};

static void hub_copy_value(char *dst, size_t cap, const char *v, size_t n)
{
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    while (n && (*v == ' ' || *v == '\t'))
        v++, n--;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

/* Link: <https://...>; rel="next" -> the URL */
static void hub_parse_link_next(char *dst, size_t cap, const char *v)
{
    const char *lt = strchr(v, '<'), *gt = lt ? strchr(lt, '>') : NULL;
    if (lt && gt && strstr(gt, "rel=\"next\""))
        hub_copy_value(dst, cap, lt + 1, (size_t)(gt - lt - 1));
}

static size_t hub_on_header(char *buf, size_t size, size_t nitems, void *ud)
{
    struct hub_http *x = ud;
    size_t n = size * nitems;
    if (n >= 5 && !memcmp(buf, "HTTP/", 5)) { /* a new response (redirects, 100-continue) */
        const char *sp = memchr(buf, ' ', n);
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        x->etag[0] = x->content_length[0] = x->content_range[0] = x->location[0] = x->retry_after[0] = 0;
        x->link_next[0] = 0;
        return n;
    }
    const char *colon = memchr(buf, ':', n);
    if (!colon)
        return n;
    size_t klen = (size_t)(colon - buf);
    const char *v = colon + 1;
    size_t vlen = n - klen - 1;
    static const struct {
        const char *name;
        size_t off, cap;
    } fields[] = {
#define F(h, f) {h, offsetof(struct hub_http, f), sizeof((struct hub_http *)0)->f}
        F("x-linked-etag", linked_etag),     F("x-linked-size", linked_size),   F("etag", etag),
        F("content-length", content_length), F("content-range", content_range), F("location", location),
        F("x-error-code", error_code),       F("x-error-message", error_message),
        F("x-repo-commit", repo_commit),     F("retry-after", retry_after),
#undef F
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (klen == strlen(fields[i].name) && !strncasecmp(buf, fields[i].name, klen)) {
            hub_copy_value((char *)x + fields[i].off, fields[i].cap, v, vlen);
            return n;
        }
    if (klen == 4 && !strncasecmp(buf, "link", 4)) {
        char tmp[1200];
        hub_copy_value(tmp, sizeof tmp, v, vlen);
        hub_parse_link_next(x->link_next, sizeof x->link_next, tmp);
    }
    return n;
}

static void hub_body_append(struct hub_http *x, const char *data, size_t n)
{
    if (x->body_len + n > x->body_cap)
        n = x->body_cap > x->body_len ? x->body_cap - x->body_len : 0;
    if (!n)
        return;
    char *nb = realloc(x->body, x->body_len + n + 1);
    if (!nb)
        return;
    x->body = nb;
    memcpy(x->body + x->body_len, data, n);
    x->body_len += n;
    x->body[x->body_len] = 0;
}

static size_t hub_on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    struct hub_http *x = ud;
    size_t n = size * nmemb;
    if (x->fd < 0 || (x->status != 200 && x->status != 206)) {
        hub_body_append(x, data, n);
        return n;
    }
    if (!x->started) {
        x->started = true;
        if (x->status == 206) {
            long long a;
            if (sscanf(x->content_range, "bytes %lld-", &a) != 1 || a != x->have) {
                x->bad_range = true;
                return 0; /* aborts the transfer */
            }
        } else if (x->have > 0) { /* 200: the server sent the whole file; start over */
            if (ftruncate(x->fd, 0)) {
                x->write_failed = true;
                x->write_errno = errno;
                return 0;
            }
            x->have = 0;
        }
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = pwrite(x->fd, data + off, n - off, (off_t)x->have);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            x->write_failed = true;
            x->write_errno = w < 0 ? errno : ENOSPC;
            return 0;
        }
        off += (size_t)w;
        x->have += w;
    }
    if (x->prog)
        progress_update(x->prog, x->have);
    return n;
}

/* Sets up a request to url. Returns 0 or ERR_NOMEM. */
static int hub_http_begin(struct hub_http *x, const struct hub *h, const char *url)
{
    pthread_once(&hub_curl_once, hub_curl_init);
    memset(x, 0, sizeof *x);
    x->fd = -1;
    x->range_start = -1;
    x->body_cap = 64u << 20; /* a tree listing of a big repo is a few MB */
    x->curl = curl_easy_init();
    if (!x->curl)
        return ERR_NOMEM;
    if (h->token[0]) {
        char auth[300];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", h->token);
        x->headers = curl_slist_append(x->headers, auth);
    }
    CURL *c = x->curl;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, x->headers);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "wafer-pull/1 (huggingface_hub-compatible)");
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, hub_on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, hub_on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, x->curl_err);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    /* a stalled transfer (under 1 byte/s for 60 s) is a broken one: it is retried (and resumed) */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, ""); /* JSON listings compress well; file bytes are sent as is */
    return 0;
}

static void hub_http_end(struct hub_http *x)
{
    curl_easy_cleanup(x->curl);
    curl_slist_free_all(x->headers);
    free(x->body);
    x->curl = NULL;
    x->headers = NULL;
    x->body = NULL;
}

/* Maps a failed HTTP status to a code and a message that says what to do. what: "repo" or "repo/path". */
static int hub_status_error(const struct hub *h, const struct hub_http *x, const struct hub_spec *spec,
                            const char *file, char *err)
{
    const char *code = x->error_code, *msg = x->error_message[0] ? x->error_message : NULL;
    char extra[300] = "";
    if (msg)
        snprintf(extra, sizeof extra, " (hub: %s)", msg);
    switch (x->status) {
    case 401:
        if (h->token[0])
            return err_set(err, ERR_AUTH, "%s: the hub refused the token in HF_TOKEN (HTTP 401)%s: check that it "
                           "is valid and can read this repository", spec->repo, extra);
        return err_set(err, ERR_AUTH, "%s: HTTP 401 from %s%s: the repository is private or gated, or does not "
                       "exist; set HF_TOKEN to a token with read access (https://huggingface.co/settings/tokens)",
                       spec->repo, h->endpoint, extra);
    case 403:
        if (!strcasecmp(code, "GatedRepo"))
            return err_set(err, ERR_AUTH, "%s is gated (HTTP 403)%s: accept its conditions on %s/%s with the "
                           "account whose token is in HF_TOKEN", spec->repo, extra, h->endpoint, spec->repo);
        return err_set(err, ERR_AUTH, "%s: access denied (HTTP 403)%s", spec->repo, extra);
    case 404:
        if (!strcasecmp(code, "RevisionNotFound"))
            return err_set(err, ERR_NOT_FOUND, "%s has no revision '%s' (HTTP 404)%s", spec->repo, spec->revision,
                           extra);
        if (!strcasecmp(code, "EntryNotFound") || (file && strcasecmp(code, "RepoNotFound")))
            return err_set(err, ERR_NOT_FOUND, "%s has no file '%s' at revision '%s' (HTTP 404)%s", spec->repo,
                           file ? file : "?", spec->revision, extra);
        return err_set(err, ERR_NOT_FOUND, "repository %s not found on %s (HTTP 404)%s", spec->repo, h->endpoint,
                       extra);
    default:
        break;
    }
    char body[200] = "";
    if (!msg && x->body_len) {
        snprintf(body, sizeof body, ": %.*s", (int)(x->body_len > 150 ? 150 : x->body_len), x->body);
        for (char *p = body; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
    }
    return err_set(err, ERR_IO, "%s: HTTP %ld from %s%s%s", spec->repo, x->status, h->endpoint, extra, body);
}

/* Percent-encodes each segment of a path (keeps the slashes). NULL on OOM; caller frees. */
static char *hub_escape_path(const char *path)
{
    size_t cap = strlen(path) * 3 + 1, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if (isalnum(*p) || strchr("-._~/", *p))
            out[len++] = (char)*p;
        else
            len += (size_t)snprintf(out + len, cap - len, "%%%02X", *p);
    }
    out[len] = 0;
    return out;
}

static char *hub_resolve_url(const struct hub *h, const struct hub_spec *spec)
{
    char *path = hub_escape_path(spec->file), *rev = hub_escape_path(spec->revision);
    char *url = NULL;
    if (path && rev && asprintf(&url, "%s/%s/resolve/%s/%s", h->endpoint, spec->repo, rev, path) < 0)
        url = NULL;
    free(path);
    free(rev);
    return url;
}

static int hub_transport_error(const struct hub *h, struct hub_http *x, CURLcode res, const char *what, char *err)
{
    return err_set(err, res == CURLE_OPERATION_TIMEDOUT ? ERR_TIMEOUT : ERR_IO, "%s: cannot reach %s: %s", what,
                   h->endpoint, x->curl_err[0] ? x->curl_err : curl_easy_strerror(res));
}

void hub_files_free(struct hub_file *files, int n)
{
    for (int i = 0; files && i < n; i++)
        free(files[i].path);
    free(files);
}

int hub_list_files(const struct hub *h, const char *repo, const char *revision, struct hub_file **files, int *n,
                   char *err)
{
    *files = NULL;
    *n = 0;
    struct hub_spec spec;
    memset(&spec, 0, sizeof spec);
    snprintf(spec.repo, sizeof spec.repo, "%s", repo);
    snprintf(spec.revision, sizeof spec.revision, "%s", revision);
    char *rev = hub_escape_path(revision), *url = NULL;
    if (!rev || asprintf(&url, "%s/api/models/%s/tree/%s?recursive=true", h->endpoint, repo, rev) < 0) {
        free(rev);
        return err_set(err, ERR_NOMEM, "out of memory");
    }
    free(rev);
    struct hub_file *out = NULL;
    int count = 0, cap = 0, rc = 0;
    for (int page = 0; url && page < 1000; page++) {
        struct hub_http x;
        if (hub_http_begin(&x, h, url)) {
            rc = err_set(err, ERR_NOMEM, "out of memory");
            break;
        }
        curl_easy_setopt(x.curl, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(x.curl, CURLOPT_MAXREDIRS, 5L);
        curl_easy_setopt(x.curl, CURLOPT_TIMEOUT, 120L);
        CURLcode res = curl_easy_perform(x.curl);
        free(url);
        url = NULL;
        if (res != CURLE_OK) {
            rc = hub_transport_error(h, &x, res, repo, err);
        } else if (x.status != 200) {
            rc = hub_status_error(h, &x, &spec, NULL, err);
        } else {
            json_error_t je;
            json_t *arr = json_loadb(x.body ? x.body : "", x.body_len, 0, &je);
            if (!json_is_array(arr)) {
                rc = err_set(err, ERR_FORMAT, "%s: the hub's file list is not a JSON array (%s)", repo, je.text);
            } else {
                size_t i;
                json_t *e;
                json_array_foreach(arr, i, e) {
                    const char *type = json_string_value(json_object_get(e, "type"));
                    const char *path = json_string_value(json_object_get(e, "path"));
                    if (!path || (type && strcmp(type, "file")))
                        continue;
                    if (count == cap) {
                        cap = cap ? cap * 2 : 64;
                        struct hub_file *nf = realloc(out, sizeof *out * (size_t)cap);
                        if (!nf) {
                            rc = err_set(err, ERR_NOMEM, "out of memory");
                            break;
                        }
                        out = nf;
                    }
                    struct hub_file *f = &out[count];
                    memset(f, 0, sizeof *f);
                    if (!(f->path = strdup(path))) {
                        rc = err_set(err, ERR_NOMEM, "out of memory");
                        break;
                    }
                    count++;
                    json_t *lfs = json_object_get(e, "lfs");
                    f->size = json_integer_value(json_object_get(lfs ? lfs : e, "size"));
                    const char *oid = json_string_value(json_object_get(lfs, "oid"));
                    if (oid && strlen(oid) == 64)
                        snprintf(f->sha256, sizeof f->sha256, "%s", oid);
                }
            }
            json_decref(arr);
            if (!rc && x.link_next[0] && !(url = strdup(x.link_next)))
                rc = err_set(err, ERR_NOMEM, "out of memory");
        }
        hub_http_end(&x);
        if (rc)
            break;
    }
    free(url);
    if (rc) {
        hub_files_free(out, count);
        return rc;
    }
    *files = out;
    *n = count;
    return 0;
}

/* An ETag value without W/ and quotes. */
static void hub_etag_clean(char *dst, size_t cap, const char *v)
{
    if (!strncmp(v, "W/", 2))
        v += 2;
    size_t n = strlen(v);
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"')
        v++, n -= 2;
    hub_copy_value(dst, cap, v, n);
}

static bool hub_is_sha256(const char *s)
{
    if (strlen(s) != 64)
        return false;
    for (int i = 0; i < 64; i++)
        if (!isxdigit((unsigned char)s[i]))
            return false;
    return true;
}

int hub_file_meta(const struct hub *h, const struct hub_spec *spec, struct hub_meta *m, char *err)
{
    memset(m, 0, sizeof *m);
    m->size = -1;
    char *url = hub_resolve_url(h, spec);
    if (!url)
        return err_set(err, ERR_NOMEM, "out of memory");
    int rc = 0;
    /* huggingface_hub follows relative redirects only (a renamed repo); an absolute one is the CDN's */
    for (int hop = 0;; hop++) {
        struct hub_http x;
        if (hub_http_begin(&x, h, url)) {
            free(url);
            return err_set(err, ERR_NOMEM, "out of memory");
        }
        curl_easy_setopt(x.curl, CURLOPT_NOBODY, 1L);
        curl_easy_setopt(x.curl, CURLOPT_TIMEOUT, 60L);
        curl_easy_setopt(x.curl, CURLOPT_ACCEPT_ENCODING, NULL); /* Content-Length of the bytes themselves */
        CURLcode res = curl_easy_perform(x.curl);
        if (res != CURLE_OK) {
            rc = hub_transport_error(h, &x, res, spec->repo, err);
        } else if (x.status >= 300 && x.status < 400 && x.location[0] == '/' && hop < 5) {
            free(url);
            if (asprintf(&url, "%s%s", h->endpoint, x.location) < 0)
                url = NULL;
            hub_http_end(&x);
            if (!url)
                return err_set(err, ERR_NOMEM, "out of memory");
            continue;
        } else if (x.status >= 400 || x.status < 200 || (x.status >= 300 && !x.location[0])) {
            rc = hub_status_error(h, &x, spec, spec->file, err);
        } else {
            char tag[100];
            hub_etag_clean(tag, sizeof tag, x.linked_etag);
            if (hub_is_sha256(tag)) {
                for (int i = 0; i < 64; i++)
                    m->sha256[i] = (char)tolower((unsigned char)tag[i]);
                m->sha256[64] = 0;
            }
            hub_etag_clean(m->etag, sizeof m->etag, x.linked_etag[0] ? x.linked_etag : x.etag);
            const char *sz = x.linked_size[0] ? x.linked_size : x.status < 300 ? x.content_length : "";
            if (*sz)
                m->size = strtoll(sz, NULL, 10);
            snprintf(m->commit, sizeof m->commit, "%s", x.repo_commit);
        }
        hub_http_end(&x);
        break;
    }
    free(url);
    return rc;
}

/* Seconds to wait before retry k (0-based): Retry-After when the server gave a small one, else 0.5 * 2^k,
 * at most 8. */
static double hub_retry_delay(int k, const char *retry_after)
{
    char *end;
    double ra = strtod(retry_after, &end);
    if (end != retry_after && !*end && ra >= 0 && ra <= 60)
        return ra;
    double d = 0.5 * (double)(1 << (k < 5 ? k : 5));
    return d > 8 ? 8 : d;
}

int hub_download(const struct hub *h, const struct hub_spec *spec, int fd, int64_t size, const char *label,
                 char *err)
{
    char *url = hub_resolve_url(h, spec);
    if (!url)
        return err_set(err, ERR_NOMEM, "out of memory");
    off_t end = lseek(fd, 0, SEEK_END);
    int64_t have = end < 0 ? 0 : end;
    if (size >= 0 && have > size) { /* longer than the file: not ours */
        if (ftruncate(fd, 0)) {
            free(url);
            return err_set(err, ERR_IO, "cannot truncate the partial download: %s", strerror(errno));
        }
        have = 0;
    }
    struct progress prog;
    progress_begin(&prog, label, size, have, h->quiet);
    if (have > 0 && !h->quiet) {
        char b[16];
        progress_break(&prog);
        fprintf(stderr, "%s: resuming a partial download at %s\n", label, progress_bytes(have, b));
    }
    int rc = 0;
    for (int attempt = 0;; attempt++) {
        if (size >= 0 && have == size)
            break;
        struct hub_http x;
        if (hub_http_begin(&x, h, url)) {
            rc = err_set(err, ERR_NOMEM, "out of memory");
            break;
        }
        x.fd = fd;
        x.have = have;
        x.prog = &prog;
        x.body_cap = 4096;
        char range[48];
        if (have > 0) {
            snprintf(range, sizeof range, "%lld-", (long long)have);
            curl_easy_setopt(x.curl, CURLOPT_RANGE, range);
        }
        curl_easy_setopt(x.curl, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(x.curl, CURLOPT_MAXREDIRS, 10L);
        curl_easy_setopt(x.curl, CURLOPT_ACCEPT_ENCODING, NULL);
        CURLcode res = curl_easy_perform(x.curl);
        int64_t got = x.have - (x.started && x.status == 200 ? 0 : have);
        have = x.have;
        bool retryable = false;
        char why[300];
        if (x.write_failed) {
            rc = err_set(err, ERR_IO, "cannot write the download: %s", strerror(x.write_errno));
        } else if (x.bad_range) {
            rc = err_set(err, ERR_FORMAT, "the server answered the range request from byte %lld with '%s'",
                         (long long)have, x.content_range);
        } else if (res == CURLE_OK && x.status == 416 && have > 0) {
            /* the part file is not a prefix of this file (the server's size differs): start over */
            if (ftruncate(fd, 0)) {
                rc = err_set(err, ERR_IO, "cannot truncate the partial download: %s", strerror(errno));
            } else {
                have = 0;
                snprintf(why, sizeof why, "the server refused to resume (HTTP 416)");
                retryable = true;
            }
        } else if (res == CURLE_OK && (x.status == 200 || x.status == 206)) {
            if (size < 0 || have == size) {
                hub_http_end(&x);
                break;
            }
            snprintf(why, sizeof why, "the transfer ended at byte %lld of %lld", (long long)have, (long long)size);
            retryable = true;
        } else if (res == CURLE_OK) {
            if (x.status == 408 || x.status == 429 || x.status >= 500) {
                snprintf(why, sizeof why, "HTTP %ld", x.status);
                retryable = true;
            } else {
                rc = hub_status_error(h, &x, spec, spec->file, err);
            }
        } else {
            snprintf(why, sizeof why, "%s", x.curl_err[0] ? x.curl_err : curl_easy_strerror(res));
            retryable = res != CURLE_WRITE_ERROR && res != CURLE_OUT_OF_MEMORY && res != CURLE_ABORTED_BY_CALLBACK;
            if (!retryable)
                rc = err_set(err, ERR_IO, "%s: %s", spec->repo, why);
        }
        double delay = retryable ? hub_retry_delay(attempt, x.retry_after) : 0;
        hub_http_end(&x);
        if (rc)
            break;
        if (attempt >= h->retries) {
            char b[16];
            rc = err_set(err, ERR_IO, "%s: download failed after %d attempt%s: %s; %s so far is kept, and the next "
                         "`wafer pull` resumes it", spec->repo, attempt + 1, attempt ? "s" : "", why,
                         progress_bytes(have, b));
            break;
        }
        progress_break(&prog);
        char b[16];
        if (!h->quiet)
            fprintf(stderr, "%s: %s (%s received this attempt); resuming from %s in %.1f s (retry %d of %d)\n", label,
                    why, progress_bytes(got > 0 ? got : 0, b), progress_bytes(have, (char[16]){0}), delay,
                    attempt + 1, h->retries);
        struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
        while (nanosleep(&ts, &ts) && errno == EINTR)
            ;
    }
    if (!rc)
        progress_end(&prog, NULL);
    else
        progress_break(&prog);
    free(url);
    return rc;
}
