/* Tests for the multipart/form-data parser: the boundary from Content-Type, well-formed bodies as curl and
 * the openai npm client send them (fields and a file with a filename, content holding CRLFs and
 * boundary-like bytes not preceded by CRLF, which RFC 2046 allows), and each strictness rule refused with ERR_FORMAT, also every truncation of a valid
 * body. */
#include "testutil.h"

#include "core/err.h"
#include "core/multipart.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_boundary(void **state)
{
    (void)state;
    char b[MULTIPART_BOUNDARY_MAX + 1], err[ERR_MSG_MAX];
    const char *ct = "multipart/form-data; boundary=----formdata-undici-0123";
    assert_int_equal(multipart_boundary(ct, strlen(ct), b, err), 0);
    assert_string_equal(b, "----formdata-undici-0123");
    ct = "Multipart/Form-Data;charset=utf-8; boundary=\"a b:c\"";
    assert_int_equal(multipart_boundary(ct, strlen(ct), b, err), 0);
    assert_string_equal(b, "a b:c");
    ct = "application/json";
    assert_int_equal(multipart_boundary(ct, strlen(ct), b, err), ERR_MEDIA_TYPE);
    ct = "multipart/form-data";
    assert_int_equal(multipart_boundary(ct, strlen(ct), b, err), ERR_FORMAT);
    assert_non_null(strstr(err, "no boundary"));
    ct = "multipart/form-data; boundary=";
    assert_int_equal(multipart_boundary(ct, strlen(ct), b, err), ERR_FORMAT);
    ct = "multipart/form-data; boundary=a\x01";
    assert_int_equal(multipart_boundary(ct, strlen(ct), b, err), ERR_FORMAT);
    char longb[200];
    snprintf(longb, sizeof longb, "multipart/form-data; boundary=%071d", 0);
    assert_int_equal(multipart_boundary(longb, strlen(longb), b, err), ERR_FORMAT);
}

#define BODY                                                                                                \
    "--XyZ\r\n"                                                                                             \
    "Content-Disposition: form-data; name=\"purpose\"\r\n"                                                  \
    "\r\n"                                                                                                  \
    "batch\r\n"                                                                                             \
    "--XyZ\r\n"                                                                                             \
    "Content-Disposition: form-data; name=\"file\"; filename=\"in put.jsonl\"\r\n"                          \
    "Content-Type: application/jsonl\r\n"                                                                   \
    "\r\n"                                                                                                  \
    "{\"a\":1}\r\n-XyZx\n--XyZ{\"b\":2}\n\r\n"                                                             \
    "--XyZ--\r\n"

static void test_parse_ok(void **state)
{
    (void)state;
    struct multipart_part parts[4];
    int n;
    char err[ERR_MSG_MAX];
    const char *body = BODY;
    assert_int_equal(multipart_parse(body, strlen(body), "XyZ", parts, 4, &n, err), 0);
    assert_int_equal(n, 2);
    const struct multipart_part *p = multipart_find(parts, n, "purpose");
    assert_non_null(p);
    assert_int_equal(p->len, 5);
    assert_memory_equal(p->data, "batch", 5);
    assert_null(p->filename);
    const struct multipart_part *f = multipart_find(parts, n, "file");
    assert_non_null(f);
    assert_int_equal(f->filename_len, 12);
    assert_memory_equal(f->filename, "in put.jsonl", 12);
    assert_int_equal(f->content_type_len, 17);
    const char *want = "{\"a\":1}\r\n-XyZx\n--XyZ{\"b\":2}\n";
    assert_int_equal(f->len, strlen(want));
    assert_memory_equal(f->data, want, strlen(want));
    assert_null(multipart_find(parts, n, "other"));
    /* an empty part and no trailing CRLF */
    const char *b2 = "--b\r\nContent-Disposition: form-data; name=x\r\n\r\n\r\n--b--";
    assert_int_equal(multipart_parse(b2, strlen(b2), "b", parts, 4, &n, err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(parts[0].len, 0);
    assert_int_equal(parts[0].name_len, 1);
}

static void test_parse_strict(void **state)
{
    (void)state;
    static const struct {
        const char *body, *needle;
    } bad[] = {
        {"preamble\r\n--b\r\nContent-Disposition: form-data; name=x\r\n\r\nv\r\n--b--", "does not start"},
        {"--b\r\nContent-Disposition: form-data; name=x\n\nv\r\n--b--", "CRLF"},
        {"--b\r\nContent-Type: text/plain\r\n\r\nv\r\n--b--", "no Content-Disposition"},
        {"--b\r\nContent-Disposition: attachment; name=x\r\n\r\nv\r\n--b--", "form-data"},
        {"--b\r\nContent-Disposition: form-data; filename=x\r\n\r\nv\r\n--b--", "no name"},
        {"--b\r\nContent-Disposition: form-data; name=x\r\n\r\nv\r\n--b", "followed by"},
        {"--b\r\nContent-Disposition: form-data; name=x\r\n\r\nv", "not closed"},
        {"--b\r\nContent-Disposition: form-data; name=x\r\n\r\nv\r\n--b--junk", "after the multipart close"},
        {"--b--", "no part"},
        {"--b\r\nContent-Disposition: form-data; name=x\r\nContent-Disposition: form-data; name=y\r\n\r\nv\r\n--b--",
         "two Content-Disposition"},
        {"--b\r\nnocolon\r\n\r\nv\r\n--b--", "no name"},
    };
    struct multipart_part parts[4];
    int n;
    char err[ERR_MSG_MAX];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        int rc = multipart_parse(bad[i].body, strlen(bad[i].body), "b", parts, 4, &n, err);
        if (rc != ERR_FORMAT || !strstr(err, bad[i].needle))
            fail_msg("case %zu: rc %d, err '%s', wanted '%s'", i, rc, err, bad[i].needle);
    }
    /* too many parts */
    const char *two = "--b\r\nContent-Disposition: form-data; name=x\r\n\r\nv\r\n--b\r\n"
                      "Content-Disposition: form-data; name=y\r\n\r\nw\r\n--b--\r\n";
    assert_int_equal(multipart_parse(two, strlen(two), "b", parts, 1, &n, err), ERR_FORMAT);
    assert_int_equal(multipart_parse(two, strlen(two), "b", parts, 2, &n, err), 0);
    /* every truncation of a valid body is refused (never read past the end: run under ASan) */
    const char *body = BODY;
    size_t len = strlen(body);
    for (size_t k = 0; k + 2 < len; k++) {
        char *cut = malloc(k ? k : 1);
        memcpy(cut, body, k);
        assert_int_equal(multipart_parse(cut, k, "XyZ", parts, 4, &n, err), ERR_FORMAT);
        free(cut);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boundary),
        cmocka_unit_test(test_parse_ok),
        cmocka_unit_test(test_parse_strict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
