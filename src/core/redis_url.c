/*
 * redis_url: see redis_url.h. The password may contain '@' (the last '@' ends the credentials); a host
 * cannot contain ':' or '/' (no IPv6 literals).
 */
#include "core/redis_url.h"

#include "core/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int redis_url_parse(const char *url, struct redis_url *out, char *err)
{
    memset(out, 0, sizeof *out);
    /* TLS needs hiredis >= 1.0 (hiredis_ssl); Debian 12 ships 0.14, which has none */
    if (!strncmp(url, "rediss://", 9))
        return err_set(err, ERR_INVALID_ARG,
                       "'%s': rediss:// (TLS) is not supported by this build (Debian 12's hiredis 0.14 has no TLS); "
                       "use redis:// on a trusted network, or a local TLS tunnel (stunnel) to the server", url);
    if (strncmp(url, "redis://", 8))
        goto bad;
    const char *p = url + 8;
    const char *at = strrchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon || (size_t)(at - colon - 1) >= sizeof out->password || (size_t)(colon - p) >= sizeof out->user)
            goto bad;
        snprintf(out->user, sizeof out->user, "%.*s", (int)(colon - p), p);
        snprintf(out->password, sizeof out->password, "%.*s", (int)(at - colon - 1), colon + 1);
        p = at + 1;
    }
    const char *slash = strchr(p, '/');
    const char *hend = slash ? slash : p + strlen(p);
    const char *colon = memchr(p, ':', (size_t)(hend - p));
    const char *host_end = colon ? colon : hend;
    if (host_end == p || (size_t)(host_end - p) >= sizeof out->host)
        goto bad;
    snprintf(out->host, sizeof out->host, "%.*s", (int)(host_end - p), p);
    out->port = 6379;
    if (colon) {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (end != hend || port < 1 || port > 65535)
            goto bad;
        out->port = (int)port;
    }
    if (slash && slash[1]) {
        char *end;
        long db = strtol(slash + 1, &end, 10);
        if (*end || db < 0 || db > 100000)
            goto bad;
        out->db = (int)db;
    }
    return 0;
bad:
    return err_set(err, ERR_INVALID_ARG, "'%s': expected redis://[:password@]HOST:PORT[/DB]", url);
}
