/*
 * fuzz_http_parser: libFuzzer target for http_parse_request. Besides "no crash, no out-of-bounds read" (the
 * input is copied into a buffer of exactly its size, so ASan sees any read past the end), it checks the
 * properties the server relies on:
 *   - a complete parse returns a length within the input, and every pointer it fills lies inside that
 *     header block;
 *   - the result depends only on the header block: parsing exactly its bytes gives the same length, and the
 *     block minus its last byte is incomplete (0), so the server never dispatches early;
 *   - the content length is -1, HTTP_BODY_TRANSFER_ENCODED or non-negative;
 *   - errors come with a message.
 * Any violation aborts, which libFuzzer reports as a crash with the input saved.
 */
#include "core/err.h"
#include "core/http.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                        \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "fuzz_http_parser: check failed: %s (line %d)\n", #cond, __LINE__);            \
            abort();                                                                                       \
        }                                                                                                  \
    } while (0)

static void check_span(const char *base, size_t len, const char *p, size_t n)
{
    CHECK(p >= base && n <= len && (size_t)(p - base) <= len - n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    struct http_request req;
    int64_t cl = 12345;
    char err[ERR_MSG_MAX];
    err[0] = 0;
    int r = http_parse_request(buf, size, &req, &cl, err);
    if (r < 0) {
        CHECK(r == ERR_FORMAT || r == ERR_TOO_LARGE);
        CHECK(err[0] != 0);
    } else if (r > 0) {
        size_t n = (size_t)r;
        CHECK(n <= size);
        CHECK(buf[n - 1] == '\n');
        check_span(buf, n, req.method, req.method_len);
        CHECK(req.method_len > 0);
        check_span(buf, n, req.path, req.path_len);
        if (req.query)
            check_span(buf, n, req.query, req.query_len);
        CHECK(req.minor_version >= 0 && req.minor_version <= 9);
        CHECK(req.n_headers >= 0 && req.n_headers <= HTTP_MAX_HEADERS);
        for (int i = 0; i < req.n_headers; i++) {
            check_span(buf, n, req.headers[i].name, req.headers[i].name_len);
            check_span(buf, n, req.headers[i].value, req.headers[i].value_len);
            CHECK(req.headers[i].name_len > 0);
            CHECK(http_request_header(&req, "x") == NULL || req.headers[i].name_len > 0);
        }
        CHECK(req.body == NULL && req.body_len == 0);
        CHECK(cl == -1 || cl == HTTP_BODY_TRANSFER_ENCODED || cl >= 0);
        http_request_header(&req, "content-length");
        http_request_header(&req, "Expect");

        /* Exactly the header block parses to the same result ... */
        char *head = malloc(n);
        memcpy(head, buf, n);
        struct http_request req2;
        int64_t cl2;
        CHECK(http_parse_request(head, n, &req2, &cl2, NULL) == r);
        CHECK(cl2 == cl && req2.n_headers == req.n_headers && req2.keep_alive == req.keep_alive);
        /* ... and one byte less is not complete yet. */
        CHECK(http_parse_request(head, n - 1, &req2, &cl2, NULL) == 0);
        free(head);
    } else {
        /* Incomplete: must not claim a complete request anywhere in a shorter prefix either. */
        if (size > 0)
            CHECK(http_parse_request(buf, size - 1, &req, &cl, NULL) <= 0);
    }
    free(buf);
    return 0;
}
