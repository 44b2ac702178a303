/*
 * route_models: the model manager of `wafer serve` in models mode (route_models.h has the design). It runs
 * on the router's I/O thread like everything of the router, so it needs no lock: a 100 ms tick (20 ms while
 * a model loads) reaps children (waitpid WNOHANG), polls loading children's /ready, unloads idle models
 * after keep_alive, escalates SIGTERM to SIGKILL after a grace, and retries loads waiting for memory.
 *
 * A model's life: unloaded -> (waiting for memory) -> loading (child spawned, /ready polled) -> loaded ->
 * stopping (SIGTERM sent) -> unloaded. A child that exits unasked is logged and marked unloaded; its
 * requests in flight fail through the proxy (an OpenAI-shaped 502 or a stream error event) and the next
 * request loads it again. Requests held for a model (rt_models_hold) wait in its list until it is loaded
 * or its load fails; every held request counts in the model's `active` until it ends, so a model is never
 * unloaded (keep_alive, eviction) under a request.
 *
 * Children are forked by the I/O thread with PR_SET_PDEATHSIG, so they die with it even if the parent is
 * killed -9; on shutdown the I/O thread stops them (rt_models_shutdown) before it ends. Their stdout and
 * stderr come back through a pipe and go to the manager's stderr a line at a time, "[name] " in front.
 */
#include "route/route_models.h"

#include "core/err.h"
#include "core/log.h"
#include "core/strbuf.h"
#include "route/route_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MM_TICK_MS 100
#define MM_TICK_LOADING_MS 20
#define MM_STOP_GRACE_MS 5000

enum mm_state { MM_UNLOADED, MM_WAITING, MM_LOADING, MM_LOADED, MM_STOPPING };
static const char *const mm_state_names[] = {"unloaded", "loading", "loading", "loaded", "unloading"};

enum mm_reason {
    MR_REQUEST, MR_ADMIN, MR_PRELOAD, MR_KEEP_ALIVE, MR_EVICTED, MR_DIED, MR_LOAD_FAILED, MR_SHUTDOWN, MR_COUNT_
};
static const char *const mm_reason_names[] = {"request", "admin", "preload", "keep_alive", "evicted", "child_died",
                                              "load_failed", "shutdown"};
/* Reasons that only ever load (not counted in wafer_models_unloads_total). */
static bool mm_reason_loads(enum mm_reason r) { return r == MR_REQUEST || r == MR_PRELOAD; }

struct mm_model {
    struct rt_models *mm;
    const struct route_model_conf *conf;
    char *path;             /* the path loaded (the admin API may change it) */
    int pool;
    struct rt_backend *b;   /* the pool's single backend: the child's address */
    enum mm_state state;
    enum mm_reason load_reason;
    pid_t pid;
    int port;
    int64_t t_start;        /* ms: load started (or waiting for memory since) */
    int64_t t_stop;         /* ms: SIGTERM sent */
    int64_t last_used;      /* ms monotonic; 0: never */
    int64_t last_used_unix; /* s, for GET /admin/models */
    int64_t bytes;          /* estimated memory: file + KV budget */
    int64_t kv;
    double keep_alive;
    int active;             /* requests held: waiting for the load or in flight */
    struct rt_req **waiting;
    int n_waiting, cap_waiting;
    struct up_conn *probe;  /* /ready poll in flight */
    struct ev_watch log_w;  /* the read end of the child's stdout+stderr (fd -1: none) */
    char log_buf[4096];     /* its last unfinished line */
    size_t log_len;
    int probe_status;
    char last_error[256];
    double load_seconds;    /* the last load's duration */
    uint64_t m_loads, m_load_failures, m_unloads[MR_COUNT_];
};

struct rt_models {
    struct router *r;
    bool started;       /* the first tick ran (preloads started) */
    struct route_models_config c;
    struct mm_model *m; /* [n], in the order of c.models; m[i].pool == i */
    int n;
    struct ev_timer tick;
    char exe[PATH_MAX];
    char data_dir[64];  /* a private folder for the children's batch-job stores (the Batch API is not routed) */
    struct rt_models_hooks hooks;
};

/* ---- helpers --------------------------------------------------------------------------------------- */

static int64_t mm_file_bytes(const struct rt_models *mm, const char *path)
{
    if (mm->c.path_bytes)
        return mm->c.path_bytes(path);
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

static void mm_estimate(struct mm_model *m)
{
    int64_t f = mm_file_bytes(m->mm, m->path);
    m->bytes = (f > 0 ? f : 0) + m->kv;
}

static bool mm_resident(const struct mm_model *m)
{
    return m->state == MM_LOADING || m->state == MM_LOADED;
}

int rt_models_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* Points the model's backend at the child's port. */
static void mm_set_port(struct mm_model *m, int port)
{
    struct rt_backend *b = m->b;
    up_target_close_idle(m->mm->r->loop, &b->target);
    struct sockaddr_in *a = (struct sockaddr_in *)&b->target.addr;
    a->sin_port = htons((uint16_t)port);
    m->port = port;
    snprintf(b->target.name, sizeof b->target.name, "127.0.0.1:%d", port);
    snprintf(b->host_header, sizeof b->host_header, "127.0.0.1:%d", port);
    /* the label (the model's name, set at start) stays: metrics series must not change name with each load */
    b->up = true;
    b->consecutive_failures = 0;
    b->ejected_until = 0;
    b->half_open = false;
}

/* ---- waiting requests ------------------------------------------------------------------------------ */

/* Hands every waiting request on (go) or refuses them all. The list is detached first: answering a
 * request ends it, and its release must not find itself in a list being walked. */
static void mm_release_waiters(struct mm_model *m, bool go, int status, const char *code, int retry_after,
                               const char *msg)
{
    struct rt_req **w = m->waiting;
    int n = m->n_waiting;
    m->waiting = NULL;
    m->n_waiting = m->cap_waiting = 0;
    for (int i = 0; i < n; i++) {
        if (go)
            m->mm->hooks.go(w[i]);
        else
            m->mm->hooks.refuse(w[i], status, code, retry_after, msg);
    }
    free(w);
}

/* ---- children -------------------------------------------------------------------------------------- */

static void mm_stop_child(struct mm_model *m, enum mm_reason why)
{
    if (m->probe) {
        up_cancel(m->probe);
        m->probe = NULL;
    }
    m->m_unloads[why]++;
    if (m->pid > 0) {
        kill(m->pid, SIGTERM);
        m->state = MM_STOPPING;
        m->t_stop = evloop_now_ms();
    } else {
        m->state = MM_UNLOADED;
    }
    up_target_close_idle(m->mm->r->loop, &m->b->target);
}

static void mm_unload(struct mm_model *m, enum mm_reason why)
{
    if (!mm_resident(m))
        return;
    bool was_loading = m->state == MM_LOADING;
    int64_t idle = m->last_used ? (evloop_now_ms() - m->last_used) / 1000 : -1;
    mm_stop_child(m, why);
    if (was_loading)
        mm_release_waiters(m, false, 503, "model_unloaded", 1, "the model was unloaded while it was loading");
    log_info("models: unloading '%s' (pid %d, reason: %s%s%lld s idle)", m->conf->name, (int)m->pid,
             mm_reason_names[why], idle >= 0 ? ", " : "", idle >= 0 ? (long long)idle : 0LL);
}

/* ---- the children's output ------------------------------------------------------------------------ */

/* Writes one line of m's child to stderr with the model's name in front, in one write (lines of the
 * manager and of other children never interleave inside it). */
static void mm_log_line(struct mm_model *m, const char *p, size_t n)
{
    char out[4400];
    int k = snprintf(out, sizeof out, "[%s] %.*s\n", m->conf->name, (int)(n > 4300 ? 4300 : n), p);
    if (k > 0) {
        ssize_t w = write(2, out, (size_t)k < sizeof out ? (size_t)k : sizeof out - 1);
        (void)w;
    }
}

/* Reads what the child wrote (non-blocking): whole lines go out, the rest waits; end of file closes. */
static void mm_log_drain(struct mm_model *m)
{
    if (m->log_w.fd < 0)
        return;
    for (;;) {
        ssize_t n = read(m->log_w.fd, m->log_buf + m->log_len, sizeof m->log_buf - m->log_len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return;
            if (m->log_len)
                mm_log_line(m, m->log_buf, m->log_len);
            m->log_len = 0;
            evloop_del(m->mm->r->loop, &m->log_w);
            close(m->log_w.fd);
            m->log_w.fd = -1;
            return;
        }
        m->log_len += (size_t)n;
        size_t start = 0;
        for (size_t i = 0; i < m->log_len; i++)
            if (m->log_buf[i] == '\n') {
                mm_log_line(m, m->log_buf + start, i - start);
                start = i + 1;
            }
        if (start == 0 && m->log_len == sizeof m->log_buf) { /* a line longer than the buffer: cut */
            mm_log_line(m, m->log_buf, m->log_len);
            start = m->log_len;
        }
        memmove(m->log_buf, m->log_buf + start, m->log_len - start);
        m->log_len -= start;
    }
}

static void mm_log_ready(struct ev_watch *w, uint32_t events)
{
    (void)events;
    mm_log_drain((struct mm_model *)((char *)w - offsetof(struct mm_model, log_w)));
}

/* Watches fd (the read end of a new child's output; -1: none), closing the previous child's first. */
static void mm_log_attach(struct mm_model *m, int fd)
{
    if (m->log_w.fd >= 0) {
        mm_log_drain(m);
        if (m->log_w.fd >= 0) {
            evloop_del(m->mm->r->loop, &m->log_w);
            close(m->log_w.fd);
        }
    }
    m->log_len = 0;
    m->log_w.fd = fd;
    m->log_w.fn = mm_log_ready;
    m->log_w.added = false;
    m->log_w.events = 0;
    if (fd >= 0 && evloop_add(m->mm->r->loop, &m->log_w, EPOLLIN)) {
        close(fd);
        m->log_w.fd = -1;
    }
}

/* Forks `wafer serve` for m on a fresh port. 0 or ERR_IO (the message in m->last_error). */
static int mm_spawn(struct mm_model *m)
{
    struct rt_models *mm = m->mm;
    const struct route_models_config *c = &mm->c;
    const struct route_model_conf *mc = m->conf;
    int port = rt_models_free_port();
    if (port < 0) {
        snprintf(m->last_error, sizeof m->last_error, "no free loopback port: %s", strerror(errno));
        return ERR_IO;
    }
    char sport[16], skv[32], sbatch[16], sctx[16], sthreads[16], sdata[PATH_MAX];
    snprintf(sdata, sizeof sdata, "%s/%d", mm->data_dir, (int)(m - mm->m));
    snprintf(sport, sizeof sport, "%d", port);
    snprintf(skv, sizeof skv, "%lld", (long long)m->kv);
    int batch = mc->max_batch_size ? mc->max_batch_size : c->max_batch_size;
    int ctx = mc->ctx_size ? mc->ctx_size : c->ctx_size;
    snprintf(sbatch, sizeof sbatch, "%d", batch);
    snprintf(sctx, sizeof sctx, "%d", ctx);
    snprintf(sthreads, sizeof sthreads, "%d", c->threads);
    int cap = 28 + 2 * mc->n_aliases + mc->n_args;
    char **argv = calloc((size_t)cap, sizeof *argv);
    if (!argv) {
        snprintf(m->last_error, sizeof m->last_error, "out of memory");
        return ERR_NOMEM;
    }
    int n = 0;
    argv[n++] = mm->exe;
    argv[n++] = "serve";
    argv[n++] = "--model", argv[n++] = m->path;
    argv[n++] = "--model-name", argv[n++] = mc->name;
    argv[n++] = "--host", argv[n++] = "127.0.0.1";
    argv[n++] = "--port", argv[n++] = sport;
    argv[n++] = "--kv-memory", argv[n++] = skv;
    argv[n++] = "--log-requests", argv[n++] = "false";
    argv[n++] = "--data-dir", argv[n++] = sdata;
    argv[n++] = "--batch-inflight", argv[n++] = "0";
    if (batch)
        argv[n++] = "--max-batch-size", argv[n++] = sbatch;
    if (ctx)
        argv[n++] = "--ctx-size", argv[n++] = sctx;
    if (c->threads)
        argv[n++] = "--threads", argv[n++] = sthreads;
    for (int i = 0; i < mc->n_aliases; i++)
        argv[n++] = "--model-alias", argv[n++] = mc->aliases[i];
    for (int i = 0; i < mc->n_args; i++)
        argv[n++] = mc->args[i];
    argv[n] = NULL;
    int lp[2] = {-1, -1}; /* the child's output, relayed line by line with its name in front */
    if (pipe2(lp, O_CLOEXEC | O_NONBLOCK))
        lp[0] = lp[1] = -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* the child: async-signal-safe calls only until exec */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        int fd = open("/dev/null", O_RDONLY);
        if (fd >= 0) {
            dup2(fd, 0);
            if (fd > 2)
                close(fd);
        }
        if (lp[1] >= 0) { /* dup2 clears O_CLOEXEC on the copies; the blocking flag is the reader's only */
            int fl = fcntl(lp[1], F_GETFL);
            fcntl(lp[1], F_SETFL, fl & ~O_NONBLOCK);
            dup2(lp[1], 1);
            dup2(lp[1], 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    free(argv);
    if (lp[1] >= 0)
        close(lp[1]);
    if (pid < 0) {
        if (lp[0] >= 0)
            close(lp[0]);
        snprintf(m->last_error, sizeof m->last_error, "fork: %s", strerror(errno));
        return ERR_IO;
    }
    m->pid = pid;
    mm_log_attach(m, lp[0]);
    mm_set_port(m, port);
    return 0;
}

/* Tries to start loading m now: makes room (evicting idle models), then spawns. 0 (loading), ERR_TOO_LARGE
 * (never fits), ERR_UNAVAILABLE (busy models in the way: retry later) or ERR_IO (spawn failed). */
static int mm_try_load(struct mm_model *m)
{
    struct rt_models *mm = m->mm;
    mm_estimate(m);
    struct route_models_slot s[mm->n];
    int evict[mm->n], n_evict = 0;
    for (int i = 0; i < mm->n; i++) {
        const struct mm_model *o = &mm->m[i];
        s[i].bytes = o->bytes;
        s[i].last_used = o->last_used;
        s[i].resident = mm_resident(o);
        s[i].busy = o->state == MM_LOADING || o->active > 0;
    }
    int rc = route_models_plan_evict(s, mm->n, (int)(m - mm->m), mm->c.memory_budget, mm->c.max_loaded, evict,
                                     &n_evict);
    if (rc)
        return rc;
    for (int k = 0; k < n_evict; k++) {
        log_info("models: evicting '%s' (%lld MiB, least recently used idle) to make room for '%s' (%lld MiB)",
                 mm->m[evict[k]].conf->name, (long long)(mm->m[evict[k]].bytes >> 20), m->conf->name,
                 (long long)(m->bytes >> 20));
        mm_unload(&mm->m[evict[k]], MR_EVICTED);
    }
    rc = mm_spawn(m);
    if (rc)
        return rc;
    m->state = MM_LOADING;
    m->t_start = evloop_now_ms();
    m->last_error[0] = 0;
    evloop_timer_set(mm->r->loop, &mm->tick, m->t_start + MM_TICK_LOADING_MS);
    log_info("models: loading '%s' from %s (pid %d, port %d, ~%lld MiB, reason: %s)", m->conf->name, m->path,
             (int)m->pid, m->port, (long long)(m->bytes >> 20), mm_reason_names[m->load_reason]);
    return 0;
}

static void mm_load_failed(struct mm_model *m, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void mm_load_failed(struct mm_model *m, int status, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->last_error, sizeof m->last_error, fmt, ap);
    va_end(ap);
    m->m_load_failures++;
    log_error("models: '%s' could not be loaded: %s", m->conf->name, m->last_error);
    if (m->state == MM_WAITING)
        m->state = MM_UNLOADED;
    char msg[400];
    snprintf(msg, sizeof msg, "model '%s' could not be loaded: %s", m->conf->name, m->last_error);
    mm_release_waiters(m, false, status, code, status == 503 ? 5 : 0, msg);
}

/* Starts a load for reason why (or keeps waiting for memory). Returns what mm_try_load did. */
static int mm_load(struct mm_model *m, enum mm_reason why)
{
    if (m->state == MM_LOADING || m->state == MM_LOADED || m->state == MM_STOPPING)
        return 0;
    m->load_reason = why;
    int rc = mm_try_load(m);
    if (rc == ERR_UNAVAILABLE && m->state != MM_WAITING) {
        m->state = MM_WAITING;
        m->t_start = evloop_now_ms();
        log_info("models: '%s' waits for memory (busy models fill the budget)", m->conf->name);
    }
    return rc;
}

/* ---- readiness probe ------------------------------------------------------------------------------- */

static void probe_head(void *arg, const struct up_response *resp)
{
    struct mm_model *m = arg;
    m->probe_status = resp->status;
}
static void probe_body(void *arg, const char *data, size_t len)
{
    (void)arg, (void)data, (void)len;
}
static void probe_done(void *arg)
{
    struct mm_model *m = arg;
    m->probe = NULL;
    if (m->probe_status != 200 || m->state != MM_LOADING)
        return;
    m->state = MM_LOADED;
    m->m_loads++;
    int64_t now = evloop_now_ms();
    m->load_seconds = (double)(now - m->t_start) / 1000.0;
    m->last_used = now;
    m->last_used_unix = (int64_t)time(NULL);
    mm_estimate(m); /* an hf:// file is local now */
    log_info("models: '%s' loaded in %.2f s (pid %d, port %d)", m->conf->name, m->load_seconds, (int)m->pid, m->port);
    mm_release_waiters(m, true, 0, NULL, 0, NULL);
}
static void probe_fail(void *arg, enum up_fail kind, bool head_seen, const char *msg)
{
    (void)kind, (void)head_seen, (void)msg;
    struct mm_model *m = arg;
    m->probe = NULL;
}
static const struct up_callbacks probe_cb = {probe_head, probe_body, probe_done, probe_fail};

static void mm_probe(struct mm_model *m)
{
    if (m->probe)
        return;
    char req[256];
    int n = snprintf(req, sizeof req, "GET /ready HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n", m->port);
    struct up_timeouts to = {1000, 2000, 2000};
    char err[ERR_MSG_MAX];
    m->probe_status = 0;
    m->probe = up_request(m->mm->r->loop, &m->b->target, req, (size_t)n, &to, &probe_cb, m, err);
}

/* ---- the tick -------------------------------------------------------------------------------------- */

static void mm_reap(struct mm_model *m)
{
    if (m->pid <= 0)
        return;
    int st;
    pid_t p = waitpid(m->pid, &st, WNOHANG);
    if (p != m->pid)
        return;
    char how[64];
    if (WIFEXITED(st))
        snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(st));
    else
        snprintf(how, sizeof how, "status %d", st);
    pid_t old = m->pid;
    m->pid = 0;
    mm_log_drain(m); /* its last lines before the manager's about it */
    if (m->probe) {
        up_cancel(m->probe);
        m->probe = NULL;
    }
    up_target_close_idle(m->mm->r->loop, &m->b->target);
    switch (m->state) {
    case MM_STOPPING:
    case MM_WAITING: /* the old child of a model asked for again while it stopped */
        if (m->state == MM_STOPPING)
            m->state = MM_UNLOADED;
        log_info("models: '%s' unloaded (pid %d, %s)", m->conf->name, (int)old, how);
        break;
    case MM_LOADING:
        m->state = MM_UNLOADED;
        m->m_unloads[MR_LOAD_FAILED]++;
        mm_load_failed(m, 503, "model_load_failed", "its server (pid %d) ended while loading (%s); its log is above",
                       (int)old, how);
        break;
    case MM_LOADED:
        m->state = MM_UNLOADED;
        m->m_unloads[MR_DIED]++;
        log_warn("models: '%s' unloaded (reason: child_died: pid %d, %s); the next request loads it again",
                 m->conf->name, (int)old, how);
        break;
    default:
        break;
    }
}

static void mm_tick(struct ev_timer *t)
{
    struct rt_models *mm = (struct rt_models *)((char *)t - offsetof(struct rt_models, tick));
    if (!mm->started) { /* preloads, in the config's order, as memory allows */
        mm->started = true;
        for (int i = 0; i < mm->n; i++) {
            struct mm_model *m = &mm->m[i];
            if (!m->conf->preload)
                continue;
            int rc = mm_load(m, MR_PRELOAD);
            if (rc == ERR_UNAVAILABLE || rc == ERR_TOO_LARGE) {
                if (m->state == MM_WAITING)
                    m->state = MM_UNLOADED; /* a preload does not wait for others to go idle */
                log_warn("models: '%s' is not preloaded: it does not fit memory_budget / max_loaded next to the "
                         "models preloaded before it", m->conf->name);
            } else if (rc) {
                log_error("models: '%s' could not be preloaded: %s", m->conf->name, m->last_error);
            }
        }
    }
    int64_t now = evloop_now_ms();
    for (int i = 0; i < mm->n; i++)
        mm_reap(&mm->m[i]);
    for (int i = 0; i < mm->n; i++) {
        struct mm_model *m = &mm->m[i];
        switch (m->state) {
        case MM_LOADING:
            if (now - m->t_start > (int64_t)(mm->c.load_timeout * 1000)) {
                mm_stop_child(m, MR_LOAD_FAILED);
                mm_load_failed(m, 503, "model_load_timeout", "not ready after load_timeout (%.0f s)", mm->c.load_timeout);
            } else {
                mm_probe(m);
            }
            break;
        case MM_LOADED:
            if (m->active == 0 && m->keep_alive >= 0 && now - m->last_used >= (int64_t)(m->keep_alive * 1000))
                mm_unload(m, MR_KEEP_ALIVE);
            break;
        case MM_STOPPING:
            if (m->pid > 0 && now - m->t_stop > MM_STOP_GRACE_MS) {
                log_warn("models: '%s' (pid %d) did not stop within %d s of SIGTERM: SIGKILL", m->conf->name,
                         (int)m->pid, MM_STOP_GRACE_MS / 1000);
                kill(m->pid, SIGKILL);
                m->t_stop = now + 3600 * 1000; /* once */
            }
            break;
        default:
            break;
        }
    }
    for (int i = 0; i < mm->n; i++) {
        struct mm_model *m = &mm->m[i];
        if (m->state != MM_WAITING)
            continue;
        if (m->pid > 0) { /* its old child is still stopping */
            if (now - m->t_stop > MM_STOP_GRACE_MS) {
                kill(m->pid, SIGKILL);
                m->t_stop = now + 3600 * 1000;
            }
            continue;
        }
        if (now - m->t_start > (int64_t)(mm->c.load_timeout * 1000)) {
            m->state = MM_UNLOADED;
            mm_load_failed(m, 503, "memory_budget_busy", "the models using memory_budget stayed busy for load_timeout "
                           "(%.0f s)", mm->c.load_timeout);
            continue;
        }
        int rc = mm_try_load(m);
        if (rc && rc != ERR_UNAVAILABLE) {
            m->state = MM_UNLOADED;
            mm_load_failed(m, rc == ERR_TOO_LARGE ? 507 : 503, "model_load_failed", "%s",
                           m->last_error[0] ? m->last_error : "it does not fit memory_budget");
        }
    }
    bool loading = false;
    for (int i = 0; i < mm->n; i++)
        loading |= mm->m[i].state == MM_LOADING;
    /* a loading child's /ready is polled more often: the first request waits for it */
    evloop_timer_set(mm->r->loop, &mm->tick, now + (loading ? MM_TICK_LOADING_MS : MM_TICK_MS));
}

/* ---- the proxy's hooks ----------------------------------------------------------------------------- */

bool rt_models_hold(struct router *r, struct rt_req *q, int pool)
{
    struct rt_models *mm = r->models;
    if (pool < 0 || pool >= mm->n)
        return false;
    struct mm_model *m = &mm->m[pool];
    m->active++;
    m->last_used = evloop_now_ms();
    m->last_used_unix = (int64_t)time(NULL);
    if (m->state == MM_LOADED)
        return false;
    char msg[400];
    if (!mm->c.load_on_request && m->state != MM_LOADING && m->state != MM_WAITING) {
        snprintf(msg, sizeof msg, "model '%s' is not loaded (load_on_request is off: POST /admin/models/load "
                 "{\"model\": \"%s\"} first)", m->conf->name, m->conf->name);
        mm->hooks.refuse(q, 503, "model_not_loaded", 0, msg);
        return true;
    }
    if (m->state == MM_UNLOADED || m->state == MM_STOPPING) {
        if (m->state == MM_STOPPING) {
            /* a new request for a model being stopped: it is loaded again once the old child has gone */
            m->state = MM_WAITING;
            m->load_reason = MR_REQUEST;
            m->t_start = evloop_now_ms();
        } else {
            int rc = mm_load(m, MR_REQUEST);
            if (rc == ERR_TOO_LARGE) {
                snprintf(msg, sizeof msg, "model '%s' needs about %lld MiB (file + kv_memory), more than "
                         "memory_budget (%lld MiB) allows even with every other model unloaded", m->conf->name,
                         (long long)(m->bytes >> 20), (long long)(mm->c.memory_budget >> 20));
                mm->hooks.refuse(q, 507, "model_too_large", 0, msg);
                return true;
            }
            if (rc && rc != ERR_UNAVAILABLE) {
                snprintf(msg, sizeof msg, "model '%s' could not be loaded: %s", m->conf->name, m->last_error);
                mm->hooks.refuse(q, 503, "model_load_failed", 5, msg);
                return true;
            }
        }
    }
    if (m->n_waiting == m->cap_waiting) {
        int nc = m->cap_waiting ? 2 * m->cap_waiting : 8;
        struct rt_req **nw = realloc(m->waiting, (size_t)nc * sizeof *nw);
        if (!nw) {
            mm->hooks.refuse(q, 503, "out_of_memory", 1, "out of memory");
            return true;
        }
        m->waiting = nw;
        m->cap_waiting = nc;
    }
    m->waiting[m->n_waiting++] = q;
    return true;
}

void rt_models_release(struct router *r, struct rt_req *q, int pool)
{
    struct rt_models *mm = r->models;
    if (!mm || pool < 0 || pool >= mm->n)
        return;
    struct mm_model *m = &mm->m[pool];
    for (int i = 0; i < m->n_waiting; i++)
        if (m->waiting[i] == q) {
            m->waiting[i] = m->waiting[--m->n_waiting];
            break;
        }
    if (m->active > 0)
        m->active--;
    m->last_used = evloop_now_ms();
    m->last_used_unix = (int64_t)time(NULL);
}

void rt_models_not_found(struct router *r, char *out, size_t cap)
{
    struct rt_models *mm = r->models;
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < mm->n && n + 8 < cap; i++) {
        n += (size_t)snprintf(out + n, cap - n, "%s%s", i ? ", " : "", mm->m[i].conf->name);
        for (int a = 0; a < mm->m[i].conf->n_aliases && n + 8 < cap; a++)
            n += (size_t)snprintf(out + n, cap - n, ", %s", mm->m[i].conf->aliases[a]);
    }
    if (n >= cap)
        snprintf(out + cap - 5, 5, "...");
}

/* ---- endpoints ------------------------------------------------------------------------------------- */

static void mm_respond_json(struct http_conn *c, int status, json_t *o)
{
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!body) {
        http_respond(c, 500, "text/plain", NULL, "out of memory\n", 14);
        return;
    }
    http_respond(c, status, "application/json", "Cache-Control: no-store\r\n", body, strlen(body));
    free(body);
}

static json_t *mm_model_json(const struct mm_model *m, bool admin)
{
    json_t *o = json_object();
    json_object_set_new(o, admin ? "name" : "id", json_string(m->conf->name));
    if (!admin) {
        json_object_set_new(o, "object", json_string("model"));
        json_object_set_new(o, "created", json_integer(0));
        json_object_set_new(o, "owned_by", json_string("wafer"));
    }
    json_object_set_new(o, "state", json_string(mm_state_names[m->state]));
    json_t *al = json_array();
    for (int a = 0; a < m->conf->n_aliases; a++)
        json_array_append_new(al, json_string(m->conf->aliases[a]));
    json_object_set_new(o, "aliases", al);
    if (admin) {
        json_object_set_new(o, "path", json_string(m->path));
        json_object_set_new(o, "bytes", json_integer(m->bytes));
        json_object_set_new(o, "last_used", m->last_used_unix ? json_integer(m->last_used_unix) : json_null());
        json_object_set_new(o, "active", json_integer(m->active));
        json_object_set_new(o, "keep_alive", json_real(m->keep_alive));
        json_object_set_new(o, "pid", m->pid > 0 && m->state != MM_UNLOADED ? json_integer(m->pid) : json_null());
        json_object_set_new(o, "port", m->state == MM_LOADING || m->state == MM_LOADED ? json_integer(m->port)
                                                                                         : json_null());
        json_object_set_new(o, "load_seconds", m->m_loads ? json_real(m->load_seconds) : json_null());
        json_object_set_new(o, "last_error", m->last_error[0] ? json_string(m->last_error) : json_null());
    }
    return o;
}

static json_t *mm_list_json(const struct rt_models *mm, bool admin)
{
    json_t *data = json_array();
    for (int i = 0; i < mm->n; i++)
        json_array_append_new(data, mm_model_json(&mm->m[i], admin));
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    if (admin) {
        int64_t used = 0;
        int loaded = 0;
        for (int i = 0; i < mm->n; i++)
            if (mm_resident(&mm->m[i])) {
                used += mm->m[i].bytes;
                loaded++;
            }
        json_object_set_new(o, "memory_budget", json_integer(mm->c.memory_budget));
        json_object_set_new(o, "memory_used", json_integer(used));
        json_object_set_new(o, "loaded", json_integer(loaded));
        json_object_set_new(o, "max_loaded", json_integer(mm->c.max_loaded));
    }
    return o;
}

static bool ct_eq(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n = alen > blen ? alen : blen;
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned)((i < alen ? (unsigned char)a[i] : 0) ^ (i < blen ? (unsigned char)b[i] : 0));
    return diff == 0;
}

static bool peer_is_loopback(const char *peer)
{
    return peer && (!strncmp(peer, "127.", 4) || !strncmp(peer, "[::1]", 5) || !strncmp(peer, "::1", 3) ||
                    !strncmp(peer, "[::ffff:127.", 12));
}

/* The admin API's gate: a Bearer admin key when any is set, else a loopback peer. false: answered. */
static bool mm_admin_ok(struct rt_models *mm, struct http_conn *c, const struct http_request *req)
{
    struct router *r = mm->r;
    if (mm->c.n_admin_keys == 0) {
        if (peer_is_loopback(http_conn_peer(c)))
            return true;
        rt_respond_error(r, c, 403, "permission_error", "admin_loopback_only", NULL, NULL,
                         "the admin API is open to loopback clients only when no auth.admin_keys are set");
        return false;
    }
    const struct http_header *h = http_request_header(req, "authorization");
    const char *v = h ? h->value : "";
    size_t vl = h ? h->value_len : 0;
    if (vl >= 7 && !strncasecmp(v, "Bearer ", 7))
        v += 7, vl -= 7;
    bool ok = false;
    for (int i = 0; i < mm->c.n_admin_keys; i++)
        ok |= ct_eq(v, vl, mm->c.admin_keys[i], strlen(mm->c.admin_keys[i]));
    if (!ok) {
        r->m_limited[RT_LIM_AUTH]++;
        rt_respond_error(r, c, 401, "invalid_request_error", "invalid_api_key", NULL, NULL,
                         h ? "Incorrect admin key provided." :
                             "the admin API needs 'Authorization: Bearer <one of auth.admin_keys>'");
    }
    return ok;
}

static struct mm_model *mm_find(struct rt_models *mm, const char *name)
{
    for (int i = 0; i < mm->n; i++) {
        if (!strcmp(mm->m[i].conf->name, name))
            return &mm->m[i];
        for (int a = 0; a < mm->m[i].conf->n_aliases; a++)
            if (!strcmp(mm->m[i].conf->aliases[a], name))
                return &mm->m[i];
    }
    return NULL;
}

static void mm_admin_load(struct rt_models *mm, struct http_conn *c, const struct http_request *req, bool load)
{
    struct router *r = mm->r;
    json_error_t je;
    json_t *o = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
    const char *name = o ? json_string_value(json_object_get(o, "model")) : NULL;
    json_t *jp = o ? json_object_get(o, "path") : NULL;
    if (!o || !json_is_object(o) || !name || (jp && (!load || !json_is_string(jp) || !*json_string_value(jp)))) {
        json_decref(o);
        rt_respond_error(r, c, 400, "invalid_request_error", "invalid_body", NULL, NULL,
                         load ? "expected {\"model\": \"NAME\"} or {\"model\": \"NAME\", \"path\": \"FILE.gguf\"}"
                              : "expected {\"model\": \"NAME\"}");
        return;
    }
    struct mm_model *m = mm_find(mm, name);
    if (!m) {
        char names[1024];
        rt_models_not_found(r, names, sizeof names);
        rt_respond_error(r, c, 404, "invalid_request_error", "model_not_found", "model", NULL,
                         "The model '%.200s' does not exist (known: %s); models are added in the config file",
                         name, names);
        json_decref(o);
        return;
    }
    if (!load) {
        if (mm_resident(m) || m->state == MM_WAITING) {
            if (m->state == MM_WAITING) {
                m->state = MM_UNLOADED;
                mm_release_waiters(m, false, 503, "model_unloaded", 1, "the model was unloaded by the admin API");
                m->m_unloads[MR_ADMIN]++;
                log_info("models: '%s' will not be loaded (reason: admin)", m->conf->name);
            } else {
                mm_unload(m, MR_ADMIN);
            }
        }
        json_decref(o);
        mm_respond_json(c, 200, mm_model_json(m, true));
        return;
    }
    if (jp && strcmp(json_string_value(jp), m->path)) {
        char *np = strdup(json_string_value(jp));
        if (!np) {
            json_decref(o);
            rt_respond_error(r, c, 503, "server_error", "out_of_memory", NULL, NULL, "out of memory");
            return;
        }
        log_info("models: '%s' now loads from %s (was %s; POST /admin/models/load)", m->conf->name, np, m->path);
        free(m->path);
        m->path = np;
        if (mm_resident(m)) /* loaded from the old path: reloaded from the new one once the old child is gone */
            mm_unload(m, MR_ADMIN);
    }
    json_decref(o);
    if (m->state == MM_STOPPING) {
        m->state = MM_WAITING;
        m->load_reason = MR_ADMIN;
        m->t_start = evloop_now_ms();
    }
    int rc = mm_load(m, MR_ADMIN);
    if (rc == ERR_TOO_LARGE) {
        rt_respond_error(r, c, 507, "server_error", "model_too_large", "model", NULL,
                         "model '%s' needs about %lld MiB (file + kv_memory), more than memory_budget (%lld MiB)",
                         m->conf->name, (long long)(m->bytes >> 20), (long long)(mm->c.memory_budget >> 20));
        return;
    }
    if (rc && rc != ERR_UNAVAILABLE) {
        rt_respond_error(r, c, 503, "server_error", "model_load_failed", "model", NULL,
                         "model '%s' could not be loaded: %s", m->conf->name, m->last_error);
        return;
    }
    m->last_used = evloop_now_ms(); /* keep_alive counts from the load */
    m->last_used_unix = (int64_t)time(NULL);
    mm_respond_json(c, m->state == MM_LOADED ? 200 : 202, mm_model_json(m, true));
}

static bool req_path_is(const struct http_request *req, const char *p)
{
    return req->path_len == strlen(p) && !memcmp(req->path, p, req->path_len);
}

static bool req_method_is(const struct http_request *req, const char *m)
{
    return req->method_len == strlen(m) && !memcmp(req->method, m, req->method_len);
}

bool rt_models_request(struct router *r, struct http_conn *c, const struct http_request *req)
{
    struct rt_models *mm = r->models;
    bool get = req_method_is(req, "GET") || req_method_is(req, "HEAD");
    bool post = req_method_is(req, "POST");
    if (req_path_is(req, "/v1/models") && get) {
        mm_respond_json(c, 200, mm_list_json(mm, false));
        return true;
    }
    if (req->path_len > 11 && !memcmp(req->path, "/v1/models/", 11) && get) {
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(req->path_len - 11 > 255 ? 255 : req->path_len - 11), req->path + 11);
        struct mm_model *m = mm_find(mm, name);
        if (m)
            mm_respond_json(c, 200, mm_model_json(m, false));
        else
            rt_respond_error(r, c, 404, "invalid_request_error", "model_not_found", "model", NULL,
                             "The model '%s' does not exist", name);
        return true;
    }
    if (req_path_is(req, "/ready") && get) {
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string(r->stopping ? "draining" : "ready"));
        mm_respond_json(c, r->stopping ? 503 : 200, o);
        return true;
    }
    bool admin_path = req_path_is(req, "/admin/models") || req_path_is(req, "/admin/models/load") ||
                      req_path_is(req, "/admin/models/unload") || req_path_is(req, "/admin/drain");
    if (!admin_path)
        return false;
    bool want_post = !req_path_is(req, "/admin/models");
    if (want_post ? !post : !get) {
        char allow[64];
        snprintf(allow, sizeof allow, "Allow: %s\r\n", want_post ? "POST" : "GET");
        rt_respond_error(r, c, 405, "invalid_request_error", "method_not_allowed", NULL, allow,
                         "%.*s is not allowed on %.*s (use %s)", (int)req->method_len, req->method,
                         (int)req->path_len, req->path, want_post ? "POST" : "GET");
        return true;
    }
    if (!mm_admin_ok(mm, c, req))
        return true;
    if (req_path_is(req, "/admin/models"))
        mm_respond_json(c, 200, mm_list_json(mm, true));
    else if (req_path_is(req, "/admin/drain")) {
        log_info("models: POST /admin/drain from %s: draining (as SIGTERM)", http_conn_peer(c));
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string("draining"));
        mm_respond_json(c, 202, o);
        kill(getpid(), SIGTERM); /* the main thread takes it: the same drain as a signal */
    } else
        mm_admin_load(mm, c, req, req_path_is(req, "/admin/models/load"));
    return true;
}

void rt_models_metrics(struct router *r, struct strbuf *b)
{
    struct rt_models *mm = r->models;
    if (!mm)
        return;
    strbuf_printf(b, "# HELP wafer_models_loaded Models loaded (1) or not (0), by model.\n"
                     "# TYPE wafer_models_loaded gauge\n");
    for (int i = 0; i < mm->n; i++)
        strbuf_printf(b, "wafer_models_loaded{model=\"%s\"} %d\n", mm->m[i].conf->name, mm->m[i].state == MM_LOADED);
    strbuf_printf(b, "# HELP wafer_models_state Model state: 0 unloaded, 1 loading, 2 loaded, 3 unloading.\n"
                     "# TYPE wafer_models_state gauge\n");
    for (int i = 0; i < mm->n; i++) {
        enum mm_state s = mm->m[i].state;
        strbuf_printf(b, "wafer_models_state{model=\"%s\"} %d\n", mm->m[i].conf->name,
                      s == MM_UNLOADED ? 0 : s == MM_LOADED ? 2 : s == MM_STOPPING ? 3 : 1);
    }
    strbuf_printf(b, "# HELP wafer_models_loads_total Completed model loads.\n# TYPE wafer_models_loads_total counter\n");
    for (int i = 0; i < mm->n; i++)
        strbuf_printf(b, "wafer_models_loads_total{model=\"%s\"} %llu\n", mm->m[i].conf->name,
                      (unsigned long long)mm->m[i].m_loads);
    strbuf_printf(b, "# HELP wafer_models_load_failures_total Model loads that failed.\n"
                     "# TYPE wafer_models_load_failures_total counter\n");
    for (int i = 0; i < mm->n; i++)
        strbuf_printf(b, "wafer_models_load_failures_total{model=\"%s\"} %llu\n", mm->m[i].conf->name,
                      (unsigned long long)mm->m[i].m_load_failures);
    strbuf_printf(b, "# HELP wafer_models_unloads_total Model unloads, by reason.\n"
                     "# TYPE wafer_models_unloads_total counter\n");
    for (int i = 0; i < mm->n; i++)
        for (int k = 0; k < MR_COUNT_; k++)
            if (!mm_reason_loads((enum mm_reason)k))
                strbuf_printf(b, "wafer_models_unloads_total{model=\"%s\",reason=\"%s\"} %llu\n", mm->m[i].conf->name,
                              mm_reason_names[k], (unsigned long long)mm->m[i].m_unloads[k]);
    strbuf_printf(b, "# HELP wafer_models_memory_bytes Estimated memory of the resident models (file + KV budget).\n"
                     "# TYPE wafer_models_memory_bytes gauge\n");
    int64_t used = 0;
    for (int i = 0; i < mm->n; i++)
        if (mm_resident(&mm->m[i]))
            used += mm->m[i].bytes;
    strbuf_printf(b, "wafer_models_memory_bytes %lld\n# HELP wafer_models_memory_budget_bytes memory_budget (0: none).\n"
                     "# TYPE wafer_models_memory_budget_bytes gauge\nwafer_models_memory_budget_bytes %lld\n",
                  (long long)used, (long long)mm->c.memory_budget);
}

/* ---- life ------------------------------------------------------------------------------------------ */

struct rt_models *rt_models_create(struct router *r, struct route_models_config *c,
                                   const struct rt_models_hooks *hooks, char *err)
{
    struct rt_models *mm = calloc(1, sizeof *mm);
    if (!mm) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    mm->r = r;
    mm->hooks = *hooks;
    mm->c = *c;
    memset(c, 0, sizeof *c);
    if (mm->c.exe)
        snprintf(mm->exe, sizeof mm->exe, "%s", mm->c.exe);
    else {
        ssize_t n = readlink("/proc/self/exe", mm->exe, sizeof mm->exe - 1);
        if (n <= 0) {
            err_set(err, ERR_IO, "cannot find the wafer binary (/proc/self/exe): %s", strerror(errno));
            goto fail;
        }
        mm->exe[n] = 0;
    }
    snprintf(mm->data_dir, sizeof mm->data_dir, "/tmp/wafer-models-XXXXXX");
    if (!mkdtemp(mm->data_dir)) {
        mm->data_dir[0] = 0;
        err_set(err, ERR_IO, "cannot create a folder under /tmp for the models' stores: %s", strerror(errno));
        goto fail;
    }
    mm->n = mm->c.n_models;
    mm->m = calloc((size_t)mm->n, sizeof *mm->m);
    if (!mm->m || mm->n > r->table->n_pools) {
        err_set(err, ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < mm->n; i++)
        mm->m[i].log_w.fd = -1;
    for (int i = 0; i < mm->n; i++) {
        struct mm_model *m = &mm->m[i];
        m->mm = mm;
        m->conf = &mm->c.models[i];
        m->pool = i;
        m->b = r->table->pools[i].b[0];
        rt_health_stop(r, m->b); /* no active checks: the manager knows whether a child is there */
        /* logs and wafer_route_backend_* name the model: its child's port changes with every load */
        snprintf(m->b->label, sizeof m->b->label, "%s", m->conf->name);
        m->b->up = true;
        m->path = strdup(m->conf->path);
        if (!m->path) {
            err_set(err, ERR_NOMEM, "out of memory");
            goto fail;
        }
        m->kv = m->conf->kv_memory ? m->conf->kv_memory : mm->c.kv_memory;
        m->keep_alive = m->conf->keep_alive_set ? m->conf->keep_alive : mm->c.keep_alive;
        mm_estimate(m);
        if (mm->c.memory_budget > 0 && m->bytes > mm->c.memory_budget)
            log_warn("models: '%s' needs about %lld MiB (file + kv_memory), more than memory_budget (%lld MiB): it "
                     "cannot be loaded", m->conf->name, (long long)(m->bytes >> 20),
                     (long long)(mm->c.memory_budget >> 20));
    }
    ev_timer_init(&mm->tick, mm_tick);
    evloop_timer_set(r->loop, &mm->tick, evloop_now_ms() + MM_TICK_MS);
    return mm;
fail:
    rt_models_destroy(mm);
    return NULL;
}

void rt_models_shutdown(struct router *r)
{
    struct rt_models *mm = r->models;
    if (!mm)
        return;
    evloop_timer_cancel(r->loop, &mm->tick);
    int live = 0;
    for (int i = 0; i < mm->n; i++) {
        struct mm_model *m = &mm->m[i];
        if (m->probe) {
            up_cancel(m->probe);
            m->probe = NULL;
        }
        /* requests still waiting are ended by the router after this thread (rt_proxy_cancel_all); the
         * HTTP server has stopped, so they cannot be answered here */
        if (m->pid > 0) {
            if (m->state != MM_STOPPING) {
                m->m_unloads[MR_SHUTDOWN]++;
                log_info("models: unloading '%s' (pid %d, reason: shutdown)", m->conf->name, (int)m->pid);
            }
            kill(m->pid, SIGTERM);
            live++;
        }
        m->state = MM_UNLOADED;
    }
    int64_t deadline = evloop_now_ms() + MM_STOP_GRACE_MS;
    while (live > 0) {
        live = 0;
        for (int i = 0; i < mm->n; i++) {
            struct mm_model *m = &mm->m[i];
            mm_log_drain(m); /* a child blocked on a full pipe would never exit */
            if (m->pid > 0 && waitpid(m->pid, NULL, WNOHANG) == m->pid)
                m->pid = 0;
            if (m->pid > 0) {
                if (evloop_now_ms() > deadline) {
                    kill(m->pid, SIGKILL);
                    waitpid(m->pid, NULL, 0);
                    m->pid = 0;
                } else {
                    live++;
                }
            }
        }
        if (live)
            usleep(20000);
    }
    for (int i = 0; i < mm->n; i++) {
        mm_log_drain(&mm->m[i]); /* their last lines */
        mm_log_attach(&mm->m[i], -1);
    }
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void rt_models_destroy(struct rt_models *mm)
{
    if (!mm)
        return;
    for (int i = 0; mm->m && i < mm->n; i++) {
        struct mm_model *m = &mm->m[i];
        if (m->pid > 0) { /* not shut down (a failed start): no child outlives the server */
            kill(m->pid, SIGKILL);
            waitpid(m->pid, NULL, 0);
        }
        if (m->log_w.fd >= 0)
            close(m->log_w.fd); /* the loop goes with the router */
        free(m->waiting);
        free(m->path);
    }
    free(mm->m);
    if (mm->data_dir[0])
        nftw(mm->data_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    route_models_config_deinit(&mm->c);
    free(mm);
}
