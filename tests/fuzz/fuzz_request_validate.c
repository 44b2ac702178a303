/* libFuzzer target for request validation: the first byte picks the endpoint (completions, chat, generate,
 * tokenize, detokenize, batch_generate, generate_stream query), the rest is the body. Any input must give
 * either a parsed request or an error with a message, never a crash, leak or hang. */
#include "core/err.h"
#include "server/request_validate.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct gen_defaults d;
    gen_defaults_init(&d);
    int sel = data[0] % 7;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    struct api_error e;
    if (sel < 5) {
        struct gen_request r;
        int rc = request_parse((enum api_kind)sel, body, len, &d, &r, &e);
        if (rc && (!e.message[0] || e.code != rc))
            __builtin_trap(); /* every refusal carries a message */
        if (!rc && (r.n < 1 || r.n > REQ_MAX_N || r.n_stop > REQ_MAX_STOP || r.logprobs > REQ_MAX_LOGPROBS))
            __builtin_trap();
        gen_request_deinit(&r);
    } else if (sel == 5) {
        struct gen_request *items;
        struct api_error *errs;
        int n;
        int rc = request_parse_batch(body, len, &d, &items, &errs, &n, &e);
        if (rc && !e.message[0])
            __builtin_trap();
        gen_request_batch_free(items, errs, n);
    } else {
        struct gen_request r;
        int rc = request_parse_query(body, len, &d, &r, &e);
        if (rc && !e.message[0])
            __builtin_trap();
        gen_request_deinit(&r);
    }
    return 0;
}
