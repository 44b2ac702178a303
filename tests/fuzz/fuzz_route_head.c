/*
 * fuzz_route_head: libFuzzer target for up_parse_head, the router's parser of backend response heads (a
 * backend answering garbage must be an error for that request, never a crash). The input is copied into a
 * buffer of exactly its size, so ASan sees any read past the end. Properties checked:
 *   - a complete head has a length within the input, a status in 100..999, a content length >= -1, a
 *     Retry-After >= -1 and a NUL-terminated content type;
 *   - the result depends only on the head: its bytes alone give the same length, and without their last
 *     byte the head is incomplete (0), so the router never reads a body early;
 *   - an input past UP_MAX_HEAD without a complete head is an error, not "need more".
 * Any violation aborts, which libFuzzer reports as a crash with the input saved.
 */
#include "core/err.h"
#include "route/upstream.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                        \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            fprintf(stderr, "fuzz_route_head: check failed: %s (line %d)\n", #cond, __LINE__);             \
            abort();                                                                                       \
        }                                                                                                  \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    struct up_response r;
    int n = up_parse_head(buf, size, &r, 1700000000);
    if (n > 0) {
        CHECK((size_t)n <= size && n <= UP_MAX_HEAD);
        CHECK(r.status >= 100 && r.status <= 999);
        CHECK(r.content_length >= -1);
        CHECK(r.retry_after_ms >= -1);
        CHECK(memchr(r.content_type, 0, sizeof r.content_type) != NULL);
        struct up_response r2;
        CHECK(up_parse_head(buf, (size_t)n, &r2, 1700000000) == n);
        CHECK(r2.status == r.status && r2.content_length == r.content_length && r2.chunked == r.chunked);
        CHECK(up_parse_head(buf, (size_t)n - 1, &r2, 1700000000) == 0);
    } else if (n == 0) {
        CHECK(size <= UP_MAX_HEAD);
    } else {
        CHECK(n == ERR_FORMAT || n == ERR_TOO_LARGE);
    }
    free(buf);
    return 0;
}
