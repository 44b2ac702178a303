/*
 * retry: see retry.h. No wafer headers: this file is part of libwafer-client, which users link alone.
 */
#include "client/retry.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bool client_retry_status(int http_status, const char *x_should_retry)
{
    if (x_should_retry && !strcasecmp(x_should_retry, "true"))
        return true;
    if (x_should_retry && !strcasecmp(x_should_retry, "false"))
        return false;
    return http_status == 408 || http_status == 409 || http_status == 429 || http_status >= 500;
}

static double client_parse_number(const char *s)
{
    if (!s || !*s)
        return -1;
    char *end;
    double v = strtod(s, &end);
    while (*end == ' ')
        end++;
    return end != s && !*end && isfinite(v) ? v : -1;
}

double client_retry_after(const char *retry_after_ms, const char *retry_after, time_t now)
{
    double ms = client_parse_number(retry_after_ms);
    if (ms >= 0)
        return ms / 1000.0;
    double s = client_parse_number(retry_after);
    if (s >= 0)
        return s;
    if (!retry_after || !*retry_after)
        return -1;
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *end = strptime(retry_after, "%a, %d %b %Y %H:%M:%S GMT", &tm); /* IMF-fixdate (RFC 9110) */
    if (!end || *end)
        return -1;
    return difftime(timegm(&tm), now);
}

double client_retry_delay(int retries_done, double retry_after_s, double rand01)
{
    if (retry_after_s > 0 && retry_after_s <= 60)
        return retry_after_s;
    double d = CLIENT_RETRY_INITIAL_S; /* * 2^retries_done, capped (a loop: no libm for library users) */
    for (int i = 0; i < retries_done && d < CLIENT_RETRY_MAX_S; i++)
        d *= 2;
    if (d > CLIENT_RETRY_MAX_S)
        d = CLIENT_RETRY_MAX_S;
    d *= 1 - 0.25 * rand01;
    return d < 0 ? 0 : d;
}
