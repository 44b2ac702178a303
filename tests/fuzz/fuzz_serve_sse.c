/* Fuzzes what `wafer bench serve` reads from a network peer: arbitrary bytes, split at an arbitrary point, go
 * through the SSE framer and every event through the chunk parser; the same bytes written with the JSON
 * writer must always come back as valid JSON holding a string. Any crash, leak or sanitizer report fails. */
#include "bench/serve_sse.h"
#include "core/err.h"
#include "core/json_writer.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int fuzz_event(void *ctx, const char *data, size_t len)
{
    (void)ctx;
    struct serve_chunk c;
    char err[ERR_MSG_MAX];
    if (serve_chunk_parse(data, len, &c, err) == 0)
        free(c.text);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t cut = size ? data[0] % (size + 1) : 0;
    struct serve_sse s;
    serve_sse_init(&s);
    if (serve_sse_feed(&s, (const char *)data, cut, fuzz_event, NULL) == 0 &&
        serve_sse_feed(&s, (const char *)data + cut, size - cut, fuzz_event, NULL) == 0)
        serve_sse_finish(&s, fuzz_event, NULL);
    serve_sse_deinit(&s);

    struct json_writer w;
    json_writer_init_buffer(&w, 0);
    json_writer_string_n(&w, (const char *)data, size);
    size_t len = 0;
    char *text = json_writer_take(&w, &len);
    if (text) {
        json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (!json_is_string(v))
            abort(); /* the writer produced invalid JSON */
        json_decref(v);
        free(text);
    }
    return 0;
}
