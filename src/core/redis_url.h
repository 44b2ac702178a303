/*
 * redis_url: the one parser of Redis URLs, redis://[[user]:password@]HOST[:PORT][/DB], for every part that
 * talks to Redis (the job store, the router's shared cache). Pure string work: no connection, no hiredis.
 */
#ifndef WAFER_CORE_REDIS_URL_H
#define WAFER_CORE_REDIS_URL_H

struct redis_url {
    char host[256];
    int port;            /* 6379 when absent */
    int db;              /* 0 when absent */
    char user[128];      /* "" when absent */
    char password[256];  /* "" when absent */
};

/* Fills out from url. 0, or ERR_INVALID_ARG with "'<url>': expected redis://..." in err (ERR_MSG_MAX). */
int redis_url_parse(const char *url, struct redis_url *out, char *err);

#endif
