/*
 * http_parser: the HTTP/1.1 request-line and header parser, zero-copy and stateless.
 *
 * Design: http_parse_request() is a pure function over a byte range. It keeps no state between calls: the
 * server calls it again from the start whenever a new line of the header block has arrived. That costs a
 * rescan of at most max_header_bytes per line, and buys a parser with no hidden state to get wrong, that a
 * fuzzer can drive with nothing but bytes. Every name and value is a pointer into the caller's buffer.
 *
 * Strictness, and why: this parser fronts an API server, not a browser-facing proxy, so anything that is
 * ambiguous about where a request ends is refused instead of guessed (request smuggling lives in guesses):
 *   - header folding (obs-fold), whitespace before the colon, control characters: ERR_FORMAT;
 *   - Content-Length must be plain digits; several Content-Length headers must agree; a value that does not
 *     fit in int64 is refused;
 *   - Transfer-Encoding is not decoded: its presence is reported as HTTP_BODY_TRANSFER_ENCODED so that the
 *     server answers 501, and Transfer-Encoding together with Content-Length is refused outright.
 * Tolerance where it is harmless: bare LF line ends (as well as CRLF), and empty lines before the request line
 * (some clients send a stray CRLF after a POST body).
 *
 * Errors are detected as early as the bytes allow, so a prefix that is already invalid fails at once instead
 * of waiting for the rest of a header block that will never be acceptable.
 */
#include "core/http.h"

#include "core/err.h"

#include <string.h>

#define HTTP_MAX_EMPTY_LINES 8

/* RFC 9110 tchar: the characters of a method or a header name. */
static bool http_is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return true;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Request-target characters: visible ASCII only (anything else must be percent-encoded by the client). */
static bool http_is_target_char(unsigned char c) { return c > 0x20 && c < 0x7f; }

/* Header value characters: VCHAR, obs-text, SP and HTAB. */
static bool http_is_value_char(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

static bool http_ieq(const char *a, size_t a_len, const char *b)
{
    size_t b_len = strlen(b);
    if (a_len != b_len)
        return false;
    for (size_t i = 0; i < a_len; i++) {
        unsigned char x = (unsigned char)a[i], y = (unsigned char)b[i];
        if (x >= 'A' && x <= 'Z')
            x = (unsigned char)(x + 32);
        if (y >= 'A' && y <= 'Z')
            y = (unsigned char)(y + 32);
        if (x != y)
            return false;
    }
    return true;
}

/* Line end at p: returns its length (2 for CRLF, 1 for LF), 0 when the buffer ends before we can tell, or -1
 * when p is not a line end (a CR followed by something else counts as malformed: -2). */
static int http_line_end(const char *p, const char *end)
{
    if (p >= end)
        return 0;
    if (*p == '\n')
        return 1;
    if (*p != '\r')
        return -1;
    if (p + 1 >= end)
        return 0;
    return p[1] == '\n' ? 2 : -2;
}

/* Content-Length: 1*DIGIT, no sign, no spaces inside, no overflow. */
static int http_parse_content_length(const char *v, size_t n, int64_t *out, char *err)
{
    if (n == 0)
        return err_set(err, ERR_FORMAT, "Content-Length is empty");
    int64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return err_set(err, ERR_FORMAT, "Content-Length must be a non-negative decimal integer");
        int d = v[i] - '0';
        if (x > (INT64_MAX - d) / 10)
            return err_set(err, ERR_FORMAT, "Content-Length is too large");
        x = x * 10 + d;
    }
    *out = x;
    return 0;
}

/* Applies the Connection header's comma-separated tokens to *keep_alive ("close" wins over "keep-alive"). */
static void http_apply_connection(const char *v, size_t n, bool *keep_alive, bool *saw_close)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t start = i;
        while (i < n && v[i] != ',')
            i++;
        size_t stop = i;
        while (stop > start && (v[stop - 1] == ' ' || v[stop - 1] == '\t'))
            stop--;
        if (http_ieq(v + start, stop - start, "close"))
            *saw_close = true;
        else if (http_ieq(v + start, stop - start, "keep-alive"))
            *keep_alive = true;
    }
}

/* Request line: method SP request-target SP HTTP/1.d line-end. Returns the bytes consumed, 0, or an error. */
static int http_parse_request_line(const char *buf, const char *end, struct http_request *req, char *err)
{
    const char *p = buf;
    const char *m = p;
    while (p < end && http_is_tchar((unsigned char)*p))
        p++;
    if (p >= end)
        return 0;
    if (p == m)
        return err_set(err, ERR_FORMAT, "request line does not start with a method (byte 0x%02x)",
                       (unsigned char)*p);
    if (*p != ' ')
        return err_set(err, ERR_FORMAT, "invalid character 0x%02x in the method", (unsigned char)*p);
    req->method = m;
    req->method_len = (size_t)(p - m);
    p++;

    const char *t = p, *q = NULL;
    while (p < end && http_is_target_char((unsigned char)*p)) {
        if (*p == '?' && !q)
            q = p;
        p++;
    }
    if (p >= end)
        return 0;
    if (p == t)
        return err_set(err, ERR_FORMAT, "request line has no request target");
    if (*p == '\r' || *p == '\n')
        return err_set(err, ERR_FORMAT, "request line has no HTTP version (HTTP/0.9 is not supported)");
    if (*p != ' ')
        return err_set(err, ERR_FORMAT, "invalid character 0x%02x in the request target", (unsigned char)*p);
    req->path = t;
    req->path_len = (size_t)((q ? q : p) - t);
    req->query = q ? q + 1 : NULL;
    req->query_len = q ? (size_t)(p - q - 1) : 0;
    p++;

    static const char proto[] = "HTTP/1.";
    for (size_t i = 0; i < sizeof proto - 1; i++, p++) {
        if (p >= end)
            return 0;
        if (*p != proto[i])
            return err_set(err, ERR_FORMAT, "unsupported or malformed HTTP version (only HTTP/1.0 and 1.1)");
    }
    if (p >= end)
        return 0;
    if (*p < '0' || *p > '9')
        return err_set(err, ERR_FORMAT, "malformed HTTP version");
    req->minor_version = *p - '0';
    p++;
    int le = http_line_end(p, end);
    if (le == 0)
        return 0;
    if (le < 0)
        return err_set(err, ERR_FORMAT, "unexpected bytes after the HTTP version");
    return (int)(p + le - buf);
}

int http_parse_request(const char *buf, size_t len, struct http_request *req, int64_t *content_length,
                       char *err)
{
    const char *p = buf, *end = buf + len;
    memset(req, 0, sizeof *req);
    *content_length = -1;
    if (len > (size_t)INT32_MAX)
        return err_set(err, ERR_TOO_LARGE, "header block too large");

    /* Empty lines before the request line are ignored (RFC 9112 2.2), a few of them: the server parses
     * again at each new line, so an endless run of them would cost quadratic time. */
    for (int n_empty = 0;; n_empty++) {
        int le = http_line_end(p, end);
        if (le == 0)
            return 0;
        if (le < 0)
            break;
        if (n_empty == HTTP_MAX_EMPTY_LINES)
            return err_set(err, ERR_FORMAT, "more than %d empty lines before the request line",
                           HTTP_MAX_EMPTY_LINES);
        p += le;
    }

    int rl = http_parse_request_line(p, end, req, err);
    if (rl <= 0)
        return rl;
    p += rl;

    for (;;) {
        int le = http_line_end(p, end);
        if (le == 0)
            return 0;
        if (le > 0) {
            p += le;
            break;
        }
        if (le == -2)
            return err_set(err, ERR_FORMAT, "CR not followed by LF in the header block");
        if (*p == ' ' || *p == '\t')
            return err_set(err, ERR_FORMAT, "header folding (a line starting with whitespace) is not supported");
        if (req->n_headers == HTTP_MAX_HEADERS)
            return err_set(err, ERR_TOO_LARGE, "more than %d header fields", HTTP_MAX_HEADERS);

        const char *name = p;
        while (p < end && http_is_tchar((unsigned char)*p))
            p++;
        if (p >= end)
            return 0;
        if (p == name)
            return err_set(err, ERR_FORMAT, "header line does not start with a field name (byte 0x%02x)",
                           (unsigned char)*p);
        if (*p != ':')
            return err_set(err, ERR_FORMAT, "invalid character 0x%02x in a header field name (expected ':')",
                           (unsigned char)*p);
        struct http_header *h = &req->headers[req->n_headers];
        h->name = name;
        h->name_len = (size_t)(p - name);
        p++;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        const char *v = p;
        while (p < end && *p != '\r' && *p != '\n') {
            if (!http_is_value_char((unsigned char)*p))
                return err_set(err, ERR_FORMAT, "invalid character 0x%02x in the value of header %.*s",
                               (unsigned char)*p, (int)(h->name_len > 64 ? 64 : h->name_len), h->name);
            p++;
        }
        le = http_line_end(p, end);
        if (le == 0)
            return 0;
        if (le < 0)
            return err_set(err, ERR_FORMAT, "CR not followed by LF in the header block");
        const char *ve = p;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        h->value = v;
        h->value_len = (size_t)(ve - v);
        req->n_headers++;
        p += le;
    }

    /* Complete header block: now the headers that frame the body or the connection. */
    bool keep_alive = req->minor_version >= 1, saw_close = false, chunked = false;
    int64_t cl = -1;
    for (int i = 0; i < req->n_headers; i++) {
        const struct http_header *h = &req->headers[i];
        if (http_ieq(h->name, h->name_len, "content-length")) {
            int64_t x = 0;
            int rc = http_parse_content_length(h->value, h->value_len, &x, err);
            if (rc < 0)
                return rc;
            if (cl >= 0 && cl != x)
                return err_set(err, ERR_FORMAT, "conflicting Content-Length headers");
            cl = x;
        } else if (http_ieq(h->name, h->name_len, "transfer-encoding")) {
            chunked = true;
        } else if (http_ieq(h->name, h->name_len, "connection")) {
            http_apply_connection(h->value, h->value_len, &keep_alive, &saw_close);
        }
    }
    if (chunked && cl >= 0)
        return err_set(err, ERR_FORMAT, "both Transfer-Encoding and Content-Length are present");
    req->keep_alive = keep_alive && !saw_close;
    *content_length = chunked ? HTTP_BODY_TRANSFER_ENCODED : cl;
    return (int)(p - buf);
}

const struct http_header *http_request_header(const struct http_request *req, const char *name)
{
    for (int i = 0; i < req->n_headers; i++)
        if (http_ieq(req->headers[i].name, req->headers[i].name_len, name))
            return &req->headers[i];
    return NULL;
}

const char *http_status_text(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    case 507: return "Insufficient Storage";
    default: break;
    }
    if (status >= 100 && status < 200) return "Informational";
    if (status >= 200 && status < 300) return "Success";
    if (status >= 300 && status < 400) return "Redirection";
    if (status >= 400 && status < 500) return "Client Error";
    return "Server Error";
}
