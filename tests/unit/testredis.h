/*
 * testredis: a real redis-server for the tests of the Redis job store, on a free loopback port with its own
 * temp dir and `appendonly yes` (appendfsync always), stopped at exit. Tests skip, saying why, only when
 * redis-server is not installed.
 */
#ifndef WAFER_TESTS_TESTREDIS_H
#define WAFER_TESTS_TESTREDIS_H

#include <sys/types.h>

struct test_redis {
    pid_t pid; /* 0 when not running */
    int port;
    char dir[256];
    char url[96]; /* redis://127.0.0.1:PORT */
};

/* Starts a server; 0 when it answers PING, -1 (with a message on stderr) when it could not start, -2 when
 * redis-server is not installed. */
int test_redis_start(struct test_redis *r);

/* Stops it with sig (SIGKILL: a crash; SIGTERM: a clean shutdown) and waits for it. */
void test_redis_stop(struct test_redis *r, int sig);

/* Starts it again on the same port and dir (its append-only file brings its data back). */
int test_redis_restart(struct test_redis *r);

/* FLUSHALL, so each test starts from an empty server. 0 on success. */
int test_redis_flush(struct test_redis *r);

/* Starts the shared server once per test binary, or skips the test when redis-server is missing. */
#define TEST_REDIS_OR_SKIP(r)                                                                              \
    do {                                                                                                   \
        int rc_ = (r)->pid ? 0 : test_redis_start(r);                                                      \
        if (rc_ == -2) {                                                                                   \
            print_message("[  SKIPPED ] redis-server is not installed (apt-get install redis-server)\n"); \
            skip();                                                                                        \
        }                                                                                                  \
        assert_int_equal(rc_, 0);                                                                          \
        assert_int_equal(test_redis_flush(r), 0);                                                          \
    } while (0)

#endif
