/*
 * fuzz_multipart: libFuzzer target for multipart_parse and multipart_boundary. The first input line is the
 * Content-Type value, the rest the body (copied into a buffer of exactly its size, so ASan sees any read past
 * the end). Checks: success yields 1..max parts whose name, filename, content type and data lie inside the
 * body, in order and without overlap; errors are ERR_FORMAT with a message. Violations abort.
 */
#include "core/err.h"
#include "core/multipart.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                        \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "fuzz_multipart: check failed: %s (line %d)\n", #cond, __LINE__);              \
            abort();                                                                                       \
        }                                                                                                  \
    } while (0)

static void check_span(const char *base, size_t len, const char *p, size_t n)
{
    CHECK(p >= base && n <= len && (size_t)(p - base) <= len - n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t ctl = nl ? (size_t)(nl - data) : size;
    char *ct = malloc(ctl ? ctl : 1);
    memcpy(ct, data, ctl);
    char b[MULTIPART_BOUNDARY_MAX + 1], err[ERR_MSG_MAX];
    err[0] = 0;
    int rc = multipart_boundary(ct, ctl, b, err);
    free(ct);
    if (rc) {
        CHECK((rc == ERR_FORMAT || rc == ERR_MEDIA_TYPE) && err[0]);
        strcpy(b, "b");
    } else {
        CHECK(strlen(b) >= 1 && strlen(b) <= MULTIPART_BOUNDARY_MAX);
    }
    size_t bl = nl ? size - ctl - 1 : 0;
    char *body = malloc(bl ? bl : 1);
    if (bl)
        memcpy(body, nl + 1, bl);
    struct multipart_part parts[4];
    int n = -1;
    err[0] = 0;
    rc = multipart_parse(body, bl, b, parts, 4, &n, err);
    if (rc) {
        CHECK(rc == ERR_FORMAT && err[0]);
    } else {
        CHECK(n >= 1 && n <= 4);
        const char *prev_end = body;
        for (int i = 0; i < n; i++) {
            check_span(body, bl, parts[i].name, parts[i].name_len);
            CHECK(parts[i].name_len > 0);
            if (parts[i].filename)
                check_span(body, bl, parts[i].filename, parts[i].filename_len);
            if (parts[i].content_type)
                check_span(body, bl, parts[i].content_type, parts[i].content_type_len);
            check_span(body, bl, parts[i].data, parts[i].len);
            CHECK(parts[i].data >= prev_end);
            prev_end = parts[i].data + parts[i].len;
            CHECK(multipart_find(parts, n, "\x01\x02") == NULL || parts[i].name_len == 2);
        }
    }
    free(body);
    return 0;
}
