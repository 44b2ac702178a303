/*
 * progress: the rate is measured over this run's bytes only, so a resumed download does not claim the
 * bytes it found on disk as speed; the ETA is what remains at that rate.
 */
#include "core/clock.h"
#include "pull/progress.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *progress_bytes(int64_t n, char buf[16])
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4)
        v /= 1024, u++;
    if (u == 0)
        snprintf(buf, 16, "%lld B", (long long)n);
    else
        snprintf(buf, 16, "%.1f %s", v, units[u]);
    return buf;
}

static void progress_eta(double s, char buf[16])
{
    if (!(s >= 0) || s > 99 * 3600) {
        snprintf(buf, 16, "--:--");
        return;
    }
    int t = (int)(s + 0.5); /* under 100 hours (above) */
    if (t >= 3600)
        snprintf(buf, 16, "%d:%02d:%02d", t / 3600 % 100, t / 60 % 60, t % 60);
    else
        snprintf(buf, 16, "%d:%02d", t / 60 % 60, t % 60);
}

void progress_begin(struct progress *p, const char *label, int64_t total, int64_t first, bool quiet)
{
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->first = p->done = first;
    p->t0 = p->t_last = clock_now_s();
    p->tty = isatty(2);
    p->quiet = quiet;
    p->last_decile = total > 0 ? (int)(first * 10 / total) : 0;
}

static void progress_draw(struct progress *p, double now, bool final)
{
    char done[16], total[16], rate[16], eta[16];
    double dt = now - p->t0;
    double bps = dt > 0 ? (double)(p->done - p->first) / dt : 0;
    progress_bytes(p->done, done);
    progress_bytes(p->total > 0 ? p->total : 0, total);
    progress_bytes((int64_t)bps, rate);
    progress_eta(bps > 0 && p->total > 0 ? (double)(p->total - p->done) / bps : -1, eta);
    int pct = p->total > 0 ? (int)(p->done * 100 / p->total) : 0;
    if (p->tty) {
        char bar[31];
        int fill = p->total > 0 ? (int)(p->done * 30 / p->total) : 0;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
        bar[30] = 0;
        fprintf(stderr, "\r%s %3d%% [%s] %s / %s  %s/s  ETA %s\033[K", p->label, pct, bar, done, total, rate,
                final ? "0:00" : eta);
        p->drawn = true;
    } else if (p->total > 0) {
        fprintf(stderr, "%s: %d%% (%s of %s), %s/s, ETA %s\n", p->label, pct, done, total, rate, final ? "0:00" : eta);
    } else {
        fprintf(stderr, "%s: %s, %s/s\n", p->label, done, rate);
    }
    fflush(stderr);
}

void progress_update(struct progress *p, int64_t done)
{
    p->done = done;
    if (p->quiet)
        return;
    double now = clock_now_s();
    if (p->tty) {
        if (now - p->t_last >= 0.1) {
            p->t_last = now;
            progress_draw(p, now, false);
        }
        return;
    }
    int decile = p->total > 0 ? (int)(done * 10 / p->total) : 0;
    if (decile > p->last_decile || now - p->t_last >= 10) {
        p->last_decile = decile;
        p->t_last = now;
        if (done < p->total || p->total <= 0) /* the 100% line is progress_end's */
            progress_draw(p, now, false);
    }
}

void progress_break(struct progress *p)
{
    if (p->tty && p->drawn) {
        fputc('\n', stderr);
        p->drawn = false;
    }
}

void progress_end(struct progress *p, const char *what)
{
    if (p->quiet)
        return;
    double now = clock_now_s();
    progress_draw(p, now, true);
    if (p->tty)
        fputc('\n', stderr);
    p->drawn = false;
    if (what)
        fprintf(stderr, "%s: %s\n", p->label, what);
}
