/*
 * generate: one completion, then the same prompt streamed, with libwafer-client.
 *
 *   build/examples/generate [URL [PROMPT]]     (defaults: http://127.0.0.1:8080, "Once upon a time")
 *
 * Prints the completion, a line "---", the streamed text as it arrives, then the token counts on stderr.
 * Greedy (temperature 0) and 16 tokens, so both texts are the same.
 * Build: cc generate.c $(pkg-config --cflags --libs wafer-client)   (or `make examples` in the source tree)
 */
#include <wafer/client.h>

#include <stdio.h>

static int print_piece(void *ud, const char *text, size_t len)
{
    (void)ud;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* non-zero would stop the stream */
}

int main(int argc, char **argv)
{
    struct wafer_client_options o;
    wafer_client_options_default(&o);
    if (argc > 1)
        o.base_url = argv[1];
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    char err[WAFER_ERR_MAX];
    struct wafer_client *c = wafer_client_create(&o, err);
    if (!c) {
        fprintf(stderr, "generate: %s\n", err);
        return 2;
    }
    struct wafer_params p;
    wafer_params_default(&p);
    p.max_tokens = 16;
    p.temperature = 0;

    struct wafer_result r;
    int rc = 0;
    if (wafer_generate(c, prompt, &p, &r) == WAFER_OK) {
        printf("%s\n---\n", r.text);
    } else {
        fprintf(stderr, "generate: %s (%s, %d attempts)\n", r.error, wafer_status_name(r.status), r.attempts);
        rc = 1;
    }
    wafer_result_free(&r);

    if (rc == 0 && wafer_generate_stream(c, prompt, &p, print_piece, NULL, &r) == WAFER_OK) {
        printf("\n");
        fprintf(stderr, "prompt tokens %d, completion tokens %d, finish %s\n", r.prompt_tokens, r.completion_tokens,
                r.finish_reason);
    } else if (rc == 0) {
        fprintf(stderr, "stream: %s\n", r.error);
        rc = 1;
    }
    wafer_result_free(&r);
    wafer_client_destroy(c);
    return rc;
}
