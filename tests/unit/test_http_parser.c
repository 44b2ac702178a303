/* Tests for the HTTP request parser: one table of requests (valid and invalid), each also fed at every
 * split point to check that a prefix of a valid request asks for more bytes (0) and never completes or fails
 * early, and that bytes after the header block (a body, a pipelined request) do not change the result. */
#include "testutil.h"

#include "core/err.h"
#include "core/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_QUERY ((const char *)1) /* query must be NULL */

struct parse_case {
    const char *name;
    const char *in;   /* header block (the parser's input is in + tail) */
    const char *tail; /* bytes after the header block (body or next request), may be NULL */
    int want;         /* 1: complete (returns strlen(in)); 0: incomplete; else the negative error */
    const char *method, *path, *query;
    int minor;
    int n_headers;
    int64_t content_length;
    bool keep_alive;
};

static const struct parse_case parse_cases[] = {
    {"simple GET with CRLF", "GET / HTTP/1.1\r\nHost: a\r\n\r\n", NULL, 1, "GET", "/", NO_QUERY, 1, 1, -1, true},
    {"bare LF line ends", "GET /x HTTP/1.0\nHost: a\nX: y\n\n", NULL, 1, "GET", "/x", NO_QUERY, 0, 2, -1, false},
    {"mixed CRLF and LF", "GET /x HTTP/1.1\nHost: a\r\nX: y\n\r\n", NULL, 1, "GET", "/x", NO_QUERY, 1, 2, -1, true},
    {"POST with body and several headers",
     "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type:  application/json \t\r\n"
     "Content-Length: 5\r\nAuthorization: Bearer x\r\n\r\n",
     "hello", 1, "POST", "/v1/chat/completions", NO_QUERY, 1, 4, 5, true},
    {"pipelined request after the block", "GET /a HTTP/1.1\r\n\r\n", "GET /b HTTP/1.1\r\n\r\n", 1, "GET", "/a",
     NO_QUERY, 1, 0, -1, true},
    {"query string split", "GET /p?a=1&b=2 HTTP/1.1\r\n\r\n", NULL, 1, "GET", "/p", "a=1&b=2", 1, 0, -1, true},
    {"empty query", "GET /p? HTTP/1.1\r\n\r\n", NULL, 1, "GET", "/p", "", 1, 0, -1, true},
    {"second ? belongs to the query", "GET /p?a?b HTTP/1.1\r\n\r\n", NULL, 1, "GET", "/p", "a?b", 1, 0, -1, true},
    {"asterisk form", "OPTIONS * HTTP/1.1\r\n\r\n", NULL, 1, "OPTIONS", "*", NO_QUERY, 1, 0, -1, true},
    {"HTTP/1.0 default close", "GET / HTTP/1.0\r\n\r\n", NULL, 1, "GET", "/", NO_QUERY, 0, 0, -1, false},
    {"HTTP/1.0 keep-alive", "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", NULL, 1, "GET", "/", NO_QUERY, 0, 1,
     -1, true},
    {"HTTP/1.1 Connection: close", "GET / HTTP/1.1\r\nConnection: close\r\n\r\n", NULL, 1, "GET", "/", NO_QUERY, 1,
     1, -1, false},
    {"Connection token list", "GET / HTTP/1.1\r\nConnection: Upgrade, Close\r\n\r\n", NULL, 1, "GET", "/", NO_QUERY,
     1, 1, -1, false},
    {"close wins over keep-alive", "GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", NULL, 1,
     "GET", "/", NO_QUERY, 0, 2, -1, false},
    {"identical duplicate Content-Length", "PUT /x HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n",
     "abc", 1, "PUT", "/x", NO_QUERY, 1, 2, 3, true},
    {"Content-Length zero", "POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n", NULL, 1, "POST", "/x", NO_QUERY, 1, 1, 0,
     true},
    {"Content-Length INT64_MAX", "POST /x HTTP/1.1\r\nContent-Length: 9223372036854775807\r\n\r\n", NULL, 1, "POST",
     "/x", NO_QUERY, 1, 1, INT64_MAX, true},
    {"Transfer-Encoding flagged", "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n",
     1, "POST", "/x", NO_QUERY, 1, 1, HTTP_BODY_TRANSFER_ENCODED, true},
    {"leading empty lines skipped", "\r\n\nGET / HTTP/1.1\r\n\r\n", NULL, 1, "GET", "/", NO_QUERY, 1, 0, -1, true},
    {"empty header value", "GET / HTTP/1.1\r\nX-Empty:\r\nY:   \r\n\r\n", NULL, 1, "GET", "/", NO_QUERY, 1, 2, -1,
     true},
    {"obs-text in a value", "GET / HTTP/1.1\r\nX-Name: caf\xc3\xa9\r\n\r\n", NULL, 1, "GET", "/", NO_QUERY, 1, 1, -1,
     true},
    {"tchar method", "M-SEARCH_1 /x HTTP/1.1\r\n\r\n", NULL, 1, "M-SEARCH_1", "/x", NO_QUERY, 1, 0, -1, true},

    {"too many leading empty lines", "\r\n\r\n\r\n\r\n\n\n\n\n\nGET / HTTP/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL,
     NULL, 0, 0, 0, false},
    {"header folding refused", "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"folding with a tab", "GET / HTTP/1.1\r\nA: b\r\n\tc\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"space before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"header line without colon", "GET / HTTP/1.1\r\nBad Header\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"empty header name", "GET / HTTP/1.1\r\n: x\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"control char in header name", "GET / HTTP/1.1\r\nHo\x01st: a\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"non-ASCII header name", "GET / HTTP/1.1\r\nH\xc3\xa9: a\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"separator in header name", "GET / HTTP/1.1\r\nHo(st: a\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"control char in value", "GET / HTTP/1.1\r\nA: b\x01" "c\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"DEL in value", "GET / HTTP/1.1\r\nA: b\x7f\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"CR without LF in value", "GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"CR without LF ending the block", "GET / HTTP/1.1\r\nA: b\r\n\rX", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"invalid char in method", "G(T / HTTP/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"control char in method", "GE\x01T / HTTP/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"empty method", " / HTTP/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"double space", "GET  / HTTP/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"space in path", "GET /a b HTTP/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"control char in path", "GET /a\x01" "b HTTP/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"DEL in path", "GET /a\x7f HTTP/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"non-ASCII path", "GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"missing version (HTTP/0.9)", "GET /\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"missing version after space", "GET / \r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"lowercase protocol", "GET / http/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"non-digit minor", "GET / HTTP/1.x\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"two-digit minor", "GET / HTTP/1.10\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"NUL in request line", "GET /\0 HTTP/1.1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"differing Content-Length", "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", NULL,
     ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"negative Content-Length", "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"signed Content-Length", "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"non-numeric Content-Length", "POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"Content-Length list", "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"empty Content-Length", "POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"Content-Length overflow", "POST / HTTP/1.1\r\nContent-Length: 9223372036854775808\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"Content-Length huge", "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},
    {"Transfer-Encoding with Content-Length",
     "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", NULL, ERR_FORMAT, NULL, NULL, NULL, 0, 0, 0, false},

    {"incomplete request line", "GET /abc HTTP/1.", NULL, 0, NULL, NULL, NULL, 0, 0, 0, false},
    {"incomplete header block", "GET / HTTP/1.1\r\nHost: a\r\n", NULL, 0, NULL, NULL, NULL, 0, 0, 0, false},
    {"empty input", "", NULL, 0, NULL, NULL, NULL, 0, 0, 0, false},
};

static bool str_eq_n(const char *want, const char *got, size_t got_len)
{
    return strlen(want) == got_len && memcmp(want, got, got_len) == 0;
}

static void check_case(const struct parse_case *pc)
{
    size_t head = strlen(pc->in);
    if (strcmp(pc->name, "NUL in request line") == 0)
        head = sizeof "GET /\0 HTTP/1.1\r\n\r\n" - 1; /* strlen stops at the NUL */
    size_t tail = pc->tail ? strlen(pc->tail) : 0;
    char *buf = malloc(head + tail + 1); /* exact size, so ASan catches any read past len */
    memcpy(buf, pc->in, head);
    if (tail)
        memcpy(buf + head, pc->tail, tail);
    struct http_request req;
    int64_t cl = 7;
    char err[ERR_MSG_MAX] = "";

    int r = http_parse_request(buf, head + tail, &req, &cl, err);
    int want = pc->want == 1 ? (int)head : pc->want;
    if (r != want)
        fail_msg("%s: returned %d, want %d (%s)", pc->name, r, want, err);
    if (r < 0)
        assert_true(strlen(err) > 10); /* a sentence, not an empty message */
    if (pc->want == 1) {
        if (!str_eq_n(pc->method, req.method, req.method_len))
            fail_msg("%s: method '%.*s'", pc->name, (int)req.method_len, req.method);
        if (!str_eq_n(pc->path, req.path, req.path_len))
            fail_msg("%s: path '%.*s'", pc->name, (int)req.path_len, req.path);
        if (pc->query == NO_QUERY)
            assert_null(req.query);
        else if (!req.query || !str_eq_n(pc->query, req.query, req.query_len))
            fail_msg("%s: query '%.*s'", pc->name, (int)req.query_len, req.query ? req.query : "");
        assert_int_equal(req.minor_version, pc->minor);
        assert_int_equal(req.n_headers, pc->n_headers);
        assert_int_equal(cl, pc->content_length);
        if (req.keep_alive != pc->keep_alive)
            fail_msg("%s: keep_alive %d", pc->name, req.keep_alive);
        assert_null(req.body);
        for (int i = 0; i < req.n_headers; i++) {
            assert_true(req.headers[i].name >= buf && req.headers[i].name + req.headers[i].name_len <= buf + head);
            assert_true(req.headers[i].value >= buf &&
                        req.headers[i].value + req.headers[i].value_len <= buf + head);
        }
    }

    /* Every proper prefix of a request that completes must ask for more; one that fails may fail early,
     * with the same error, but must never complete. */
    for (size_t k = 0; k < head; k++) {
        int rk = http_parse_request(buf, k, &req, &cl, NULL);
        if (pc->want >= 0 && rk != 0)
            fail_msg("%s: prefix of %zu bytes returned %d, want 0", pc->name, k, rk);
        if (pc->want < 0 && rk != 0 && rk != pc->want)
            fail_msg("%s: prefix of %zu bytes returned %d", pc->name, k, rk);
    }
    free(buf);
}

static void test_parse_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof parse_cases / sizeof parse_cases[0]; i++)
        check_case(&parse_cases[i]);
}

static void test_header_values_and_lookup(void **state)
{
    (void)state;
    const char *in = "POST /x HTTP/1.1\r\nHost: example\r\nContent-Type:  application/json \t\r\n"
                     "X-Empty:\r\nx-dup: 1\r\nX-Dup: 2\r\n\r\n";
    struct http_request req;
    int64_t cl;
    assert_int_equal(http_parse_request(in, strlen(in), &req, &cl, NULL), (int)strlen(in));
    const struct http_header *h = http_request_header(&req, "content-type");
    assert_non_null(h);
    assert_true(str_eq_n("application/json", h->value, h->value_len)); /* surrounding whitespace trimmed */
    assert_true(str_eq_n("Content-Type", h->name, h->name_len));
    h = http_request_header(&req, "X-EMPTY");
    assert_non_null(h);
    assert_int_equal(h->value_len, 0);
    h = http_request_header(&req, "X-Dup");
    assert_true(str_eq_n("1", h->value, h->value_len)); /* the first one */
    assert_null(http_request_header(&req, "Content-Length"));
    assert_null(http_request_header(&req, "Host2"));
    assert_null(http_request_header(&req, "Hos"));
}

static char *build_headers(int n)
{
    char *b = malloc(64 + (size_t)n * 32);
    size_t o = (size_t)sprintf(b, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < n; i++)
        o += (size_t)sprintf(b + o, "X-H%d: v%d\r\n", i, i);
    sprintf(b + o, "\r\n");
    return b;
}

static void test_header_count_limit(void **state)
{
    (void)state;
    struct http_request req;
    int64_t cl;
    char err[ERR_MSG_MAX];
    char *ok = build_headers(HTTP_MAX_HEADERS);
    assert_int_equal(http_parse_request(ok, strlen(ok), &req, &cl, err), (int)strlen(ok));
    assert_int_equal(req.n_headers, HTTP_MAX_HEADERS);
    assert_true(str_eq_n("v63", req.headers[63].value, req.headers[63].value_len));
    char *bad = build_headers(HTTP_MAX_HEADERS + 1);
    assert_int_equal(http_parse_request(bad, strlen(bad), &req, &cl, err), ERR_TOO_LARGE);
    assert_non_null(strstr(err, "64"));
    /* Detected as soon as the 65th field starts, before the block is complete. */
    assert_int_equal(http_parse_request(bad, strlen(bad) - 6, &req, &cl, NULL), ERR_TOO_LARGE);
    free(ok);
    free(bad);
}

static void test_error_messages(void **state)
{
    (void)state;
    struct http_request req;
    int64_t cl;
    char err[ERR_MSG_MAX];
    const char *in = "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n";
    assert_int_equal(http_parse_request(in, strlen(in), &req, &cl, err), ERR_FORMAT);
    assert_non_null(strstr(err, "folding"));
    in = "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n";
    assert_int_equal(http_parse_request(in, strlen(in), &req, &cl, err), ERR_FORMAT);
    assert_non_null(strstr(err, "Content-Length"));
    in = "GET /\r\n\r\n";
    assert_int_equal(http_parse_request(in, strlen(in), &req, &cl, err), ERR_FORMAT);
    assert_non_null(strstr(err, "version"));
    /* err may be NULL. */
    assert_int_equal(http_parse_request(in, strlen(in), &req, &cl, NULL), ERR_FORMAT);
}

static void test_status_text(void **state)
{
    (void)state;
    assert_string_equal(http_status_text(200), "OK");
    assert_string_equal(http_status_text(400), "Bad Request");
    assert_string_equal(http_status_text(404), "Not Found");
    assert_string_equal(http_status_text(408), "Request Timeout");
    assert_string_equal(http_status_text(413), "Content Too Large");
    assert_string_equal(http_status_text(431), "Request Header Fields Too Large");
    assert_string_equal(http_status_text(501), "Not Implemented");
    assert_string_equal(http_status_text(503), "Service Unavailable");
    assert_string_equal(http_status_text(299), "Success");
    assert_string_equal(http_status_text(460), "Client Error");
    assert_string_equal(http_status_text(599), "Server Error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_table),
        cmocka_unit_test(test_header_values_and_lookup),
        cmocka_unit_test(test_header_count_limit),
        cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_status_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
