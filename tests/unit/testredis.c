/*
 * testredis: starts and stops redis-server for the Redis job store tests (see testredis.h).
 */
#include "testredis.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TEST_REDIS_MAX 8
static struct test_redis *test_redis_live[TEST_REDIS_MAX];

static void test_redis_atexit(void)
{
    for (int i = 0; i < TEST_REDIS_MAX; i++)
        if (test_redis_live[i] && test_redis_live[i]->pid > 0) {
            kill(test_redis_live[i]->pid, SIGKILL);
            waitpid(test_redis_live[i]->pid, NULL, 0);
            test_redis_live[i]->pid = 0;
        }
    for (int i = 0; i < TEST_REDIS_MAX; i++)
        if (test_redis_live[i] && test_redis_live[i]->dir[0]) {
            char cmd[300];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_redis_live[i]->dir);
            if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", test_redis_live[i]->dir);
        }
}

static int test_redis_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static const char *test_redis_binary(void)
{
    static char path[512];
    const char *p = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s:/usr/bin:/usr/local/bin:/usr/sbin", p ? p : "");
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, sizeof path, "%s/redis-server", d);
        if (access(path, X_OK) == 0)
            return path;
    }
    return NULL;
}

static int test_redis_spawn(struct test_redis *r)
{
    const char *bin = test_redis_binary();
    if (!bin)
        return -2;
    char port[16], log[300];
    snprintf(port, sizeof port, "%d", r->port);
    snprintf(log, sizeof log, "%s/redis.log", r->dir);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open("/dev/null", O_RDWR);
        if (fd >= 0) {
            dup2(fd, 0);
            dup2(fd, 1);
        }
        execl(bin, bin, "--port", port, "--bind", "127.0.0.1", "--dir", r->dir, "--appendonly", "yes",
              "--appendfsync", "always", "--save", "", "--logfile", log, "--daemonize", "no", (char *)NULL);
        _exit(127);
    }
    r->pid = pid;
    for (int i = 0; i < TEST_REDIS_MAX; i++)
        if (!test_redis_live[i] || test_redis_live[i] == r) {
            test_redis_live[i] = r;
            break;
        }
    for (int tries = 0; tries < 500; tries++) { /* up to 5 s */
        struct timeval tv = {0, 200000};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
        if (c && !c->err) {
            redisReply *rep = redisCommand(c, "PING");
            bool ok = rep && rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "PONG");
            if (rep)
                freeReplyObject(rep);
            redisFree(c);
            if (ok)
                return 0;
        } else if (c) {
            redisFree(c);
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            r->pid = 0;
            fprintf(stderr, "redis-server exited at start (see %s)\n", log);
            return -1;
        }
        usleep(10000);
    }
    fprintf(stderr, "redis-server did not answer on port %d\n", r->port);
    return -1;
}

int test_redis_start(struct test_redis *r)
{
    static bool registered;
    if (!registered) {
        atexit(test_redis_atexit);
        registered = true;
    }
    if (!test_redis_binary())
        return -2;
    snprintf(r->dir, sizeof r->dir, "/tmp/wafer-redis-XXXXXX");
    if (!mkdtemp(r->dir))
        return -1;
    r->port = test_redis_free_port();
    if (r->port <= 0)
        return -1;
    snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d", r->port);
    return test_redis_spawn(r);
}

void test_redis_stop(struct test_redis *r, int sig)
{
    if (r->pid <= 0)
        return;
    kill(r->pid, sig);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
}

int test_redis_restart(struct test_redis *r)
{
    test_redis_stop(r, SIGKILL);
    return test_redis_spawn(r);
}

int test_redis_flush(struct test_redis *r)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return -1;
    }
    redisReply *rep = redisCommand(c, "FLUSHALL");
    int rc = rep && rep->type == REDIS_REPLY_STATUS ? 0 : -1;
    if (rep)
        freeReplyObject(rep);
    redisFree(c);
    return rc;
}
