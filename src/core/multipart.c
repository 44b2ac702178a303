/*
 * multipart: see multipart.h. The body is scanned once: after the first delimiter line, each part is a
 * header block (lines up to an empty line, at most MP_MAX_HEADERS lines of at most MP_MAX_LINE bytes) and
 * content up to the next "\r\n--boundary", which is followed either by CRLF (another part) or by "--" (the
 * end). Content may hold any byte, including the boundary not preceded by CRLF.
 */
#include "core/multipart.h"

#include "core/err.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

#define MP_MAX_HEADERS 8
#define MP_MAX_LINE 1024

static bool boundary_char(unsigned char ch)
{
    /* RFC 2046 bchars */
    return isalnum(ch) || strchr("'()+_,-./:=? ", ch) != NULL;
}

int multipart_boundary(const char *ct, size_t len, char *out, char *err)
{
    static const char type[] = "multipart/form-data";
    size_t tl = sizeof type - 1;
    if (len < tl || strncasecmp(ct, type, tl) || (len > tl && ct[tl] != ';' && ct[tl] != ' '))
        return err_set(err, ERR_MEDIA_TYPE, "the body must be multipart/form-data");
    size_t i = tl;
    while (i < len) {
        while (i < len && (ct[i] == ';' || ct[i] == ' ' || ct[i] == '\t'))
            i++;
        size_t k = i;
        while (i < len && ct[i] != '=' && ct[i] != ';')
            i++;
        bool is_b = i - k == 8 && !strncasecmp(ct + k, "boundary", 8);
        if (i >= len || ct[i] != '=') {
            if (is_b)
                break;
            continue;
        }
        i++;
        const char *v = ct + i;
        size_t vl;
        if (i < len && ct[i] == '"') {
            const char *q = memchr(ct + i + 1, '"', len - i - 1);
            if (!q)
                return err_set(err, ERR_FORMAT, "the multipart boundary has no closing quote");
            v = ct + i + 1;
            vl = (size_t)(q - v);
            i = (size_t)(q - ct) + 1;
        } else {
            while (i < len && ct[i] != ';')
                i++;
            vl = (size_t)(ct + i - v);
            while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
                vl--;
        }
        if (!is_b)
            continue;
        if (vl < 1 || vl > MULTIPART_BOUNDARY_MAX || v[vl - 1] == ' ')
            return err_set(err, ERR_FORMAT, "the multipart boundary must be 1 to %d characters",
                           MULTIPART_BOUNDARY_MAX);
        for (size_t j = 0; j < vl; j++)
            if (!boundary_char((unsigned char)v[j]))
                return err_set(err, ERR_FORMAT, "the multipart boundary holds an invalid character");
        memcpy(out, v, vl);
        out[vl] = 0;
        return 0;
    }
    return err_set(err, ERR_FORMAT, "Content-Type multipart/form-data has no boundary parameter");
}

/* Finds parameter pname (e.g. "name") in a Content-Disposition value; quoted or token. */
static bool disp_param(const char *v, size_t vl, const char *pname, const char **out, size_t *out_len)
{
    size_t pl = strlen(pname);
    size_t i = 0;
    /* skip the disposition type */
    while (i < vl && v[i] != ';')
        i++;
    while (i < vl) {
        while (i < vl && (v[i] == ';' || v[i] == ' ' || v[i] == '\t'))
            i++;
        size_t k = i;
        while (i < vl && v[i] != '=' && v[i] != ';')
            i++;
        size_t kl = i - k;
        while (kl && (v[k + kl - 1] == ' ' || v[k + kl - 1] == '\t'))
            kl--;
        if (i >= vl || v[i] != '=')
            continue;
        i++;
        while (i < vl && (v[i] == ' ' || v[i] == '\t'))
            i++;
        const char *s;
        size_t sl;
        if (i < vl && v[i] == '"') {
            s = v + i + 1;
            const char *q = s;
            while (q < v + vl && *q != '"')
                q += (*q == '\\' && q + 1 < v + vl) ? 2 : 1;
            if (q >= v + vl)
                return false;
            sl = (size_t)(q - s);
            i = (size_t)(q - v) + 1;
        } else {
            s = v + i;
            while (i < vl && v[i] != ';')
                i++;
            sl = (size_t)(v + i - s);
            while (sl && (s[sl - 1] == ' ' || s[sl - 1] == '\t'))
                sl--;
        }
        if (kl == pl && !strncasecmp(v + k, pname, pl)) {
            *out = s;
            *out_len = sl;
            return true;
        }
    }
    return false;
}

/* Parses one part's header block at p (up to end); fills part's names; *next: the first content byte. */
static int parse_headers(const char *p, const char *end, struct multipart_part *part, const char **next, int idx,
                         char *err)
{
    bool have_disp = false;
    for (int h = 0;; h++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p) < MP_MAX_LINE + 1 ? (size_t)(end - p) : MP_MAX_LINE + 1);
        if (!nl)
            return err_set(err, ERR_FORMAT, "multipart part %d: a header line is unterminated or longer than %d bytes",
                           idx + 1, MP_MAX_LINE);
        if (nl == p || nl[-1] != '\r')
            return err_set(err, ERR_FORMAT, "multipart part %d: header lines must end with CRLF", idx + 1);
        size_t ll = (size_t)(nl - 1 - p);
        if (ll == 0) {
            if (!have_disp)
                return err_set(err, ERR_FORMAT, "multipart part %d has no Content-Disposition header", idx + 1);
            *next = nl + 1;
            return 0;
        }
        if (h >= MP_MAX_HEADERS)
            return err_set(err, ERR_FORMAT, "multipart part %d has more than %d headers", idx + 1, MP_MAX_HEADERS);
        const char *colon = memchr(p, ':', ll);
        if (!colon || colon == p)
            return err_set(err, ERR_FORMAT, "multipart part %d: a header line has no name", idx + 1);
        size_t nlen = (size_t)(colon - p);
        const char *v = colon + 1;
        size_t vl = ll - nlen - 1;
        while (vl && (*v == ' ' || *v == '\t'))
            v++, vl--;
        while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
            vl--;
        if (nlen == 19 && !strncasecmp(p, "content-disposition", 19)) {
            if (have_disp)
                return err_set(err, ERR_FORMAT, "multipart part %d has two Content-Disposition headers", idx + 1);
            have_disp = true;
            if (vl < 9 || strncasecmp(v, "form-data", 9) || (vl > 9 && v[9] != ';' && v[9] != ' '))
                return err_set(err, ERR_FORMAT, "multipart part %d: Content-Disposition must be form-data", idx + 1);
            if (!disp_param(v, vl, "name", &part->name, &part->name_len) || !part->name_len)
                return err_set(err, ERR_FORMAT, "multipart part %d: Content-Disposition has no name", idx + 1);
            if (!disp_param(v, vl, "filename", &part->filename, &part->filename_len))
                part->filename = NULL, part->filename_len = 0;
        } else if (nlen == 12 && !strncasecmp(p, "content-type", 12)) {
            part->content_type = v;
            part->content_type_len = vl;
        }
        p = nl + 1;
    }
}

int multipart_parse(const char *body, size_t len, const char *boundary, struct multipart_part *parts, int max_parts,
                    int *n, char *err)
{
    *n = 0;
    size_t bl = strlen(boundary);
    if (bl < 1 || bl > MULTIPART_BOUNDARY_MAX)
        return err_set(err, ERR_FORMAT, "invalid multipart boundary");
    char delim[MULTIPART_BOUNDARY_MAX + 5]; /* "\r\n--" boundary */
    memcpy(delim, "\r\n--", 4);
    memcpy(delim + 4, boundary, bl);
    size_t dl = bl + 4;
    const char *end = body + len;
    /* the first delimiter has no CRLF before it */
    if (len < dl - 2 || memcmp(body, delim + 2, dl - 2))
        return err_set(err, ERR_FORMAT, "the multipart body does not start with its boundary '--%s'", boundary);
    const char *p = body + dl - 2;
    for (;;) {
        /* after a delimiter: "--" (end) or CRLF (a part follows) */
        if (end - p >= 2 && p[0] == '-' && p[1] == '-') {
            p += 2;
            while (end - p >= 2 && p[0] == '\r' && p[1] == '\n')
                p += 2;
            if (p != end)
                return err_set(err, ERR_FORMAT, "bytes after the multipart close delimiter");
            if (*n == 0)
                return err_set(err, ERR_FORMAT, "the multipart body has no part");
            return 0;
        }
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
            return err_set(err, ERR_FORMAT, "a multipart delimiter must be followed by CRLF or '--'");
        p += 2;
        if (*n >= max_parts)
            return err_set(err, ERR_FORMAT, "the multipart body has more than %d parts", max_parts);
        struct multipart_part *part = &parts[*n];
        memset(part, 0, sizeof *part);
        const char *content = NULL;
        int rc = parse_headers(p, end, part, &content, *n, err);
        if (rc)
            return rc;
        const char *d = memmem(content, (size_t)(end - content), delim, dl);
        if (!d)
            return err_set(err, ERR_FORMAT, "multipart part %d is not closed by a boundary (truncated body?)",
                           *n + 1);
        part->data = content;
        part->len = (size_t)(d - content);
        (*n)++;
        p = d + dl;
    }
}

const struct multipart_part *multipart_find(const struct multipart_part *parts, int n, const char *name)
{
    size_t l = strlen(name);
    for (int i = 0; i < n; i++)
        if (parts[i].name_len == l && !memcmp(parts[i].name, name, l))
            return &parts[i];
    return NULL;
}
