/*
 * sd_notify: the datagram protocol of sd_notify(3) without libsystemd. The socket is created per message
 * (a few a second at most), so nothing stays open across fork or exec.
 */
#include "server/sd_notify.h"

#include "core/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

int sd_notify_send(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || n >= sizeof sa.sun_path)
        return ERR_INVALID_ARG;
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@')
        sa.sun_path[0] = 0; /* abstract namespace: the name is the bytes after the NUL, not NUL-terminated */
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/'));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return ERR_IO;
    ssize_t w;
    do
        w = sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa, len);
    while (w < 0 && errno == EINTR);
    close(fd);
    return w == (ssize_t)strlen(msg) ? 0 : ERR_IO;
}

static int64_t sd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void sd_watchdog_init(struct sd_watchdog *w)
{
    memset(w, 0, sizeof *w);
    atomic_init(&w->beat_ns, 0);
    const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    if (!usec || !*usec)
        return;
    if (pid && *pid && strtol(pid, NULL, 10) != (long)getpid())
        return; /* meant for another process (a parent that exec'd us without clearing it) */
    char *end;
    long long us = strtoll(usec, &end, 10);
    if (*end || us <= 0)
        return;
    w->interval_ns = us * 1000 / 2;
}

void sd_watchdog_beat(struct sd_watchdog *w) { atomic_store(&w->beat_ns, sd_now_ns()); }

bool sd_watchdog_tick(struct sd_watchdog *w)
{
    if (!w->interval_ns)
        return false;
    int64_t now = sd_now_ns();
    if (now < w->next_ns)
        return false;
    if (atomic_load(&w->beat_ns) >= w->asked_ns) /* the loop answered the last ask: it still turns */
        sd_notify_send("WATCHDOG=1");
    w->asked_ns = now;
    w->next_ns = now + w->interval_ns;
    return true;
}
