/*
 * store_redis: placeholder until the Redis store lands; refuses a redis:// queue with a message.
 */
#include "jobs/store.h"

struct jobs_backend *jobs_redis_open(const char *url, const char *consumer, int lease_ms, char *err)
{
    err_set(err, ERR_UNSUPPORTED, "queue %s: this build has no Redis job store yet", url);
    return NULL;
}
