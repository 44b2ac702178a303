/*
 * serve_html: the self-contained HTML report. Everything is inline: CSS in a <style> block and every chart
 * an <svg> drawn here (no scripts, no fonts, no network), so the page opens from a mail attachment or an
 * air-gapped machine and prints. Charts: latency CDFs per metric (one line per run), a histogram per metric
 * and run, for a sweep throughput and latency against concurrency (or request rate) and TTFT against
 * prompt length, and for conversations (--turns) TTFT and the prefix cache's share of the prompt by turn.
 * Every user-supplied string is HTML-escaped.
 */
#include "bench/serve_report.h"

#include "core/err.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const html_colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define HTML_N_COLORS (sizeof html_colors / sizeof html_colors[0])

static void html_escape(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A step of 1, 2 or 5 times a power of ten giving about target ticks over range. */
static double html_nice_step(double range, int target)
{
    if (!(range > 0))
        return 1;
    double raw = range / target, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

static void html_tick_label(char *buf, size_t cap, double v, double step)
{
    if (fabs(v) < step * 1e-6)
        v = 0;
    if (step >= 1 || v == 0)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%.*f", (int)ceil(-log10(step)), v);
}

struct html_series {
    char name[80];
    const double *x, *y;
    int n;
    const char *color;
    bool dashed;
    bool steps;       /* draw as an empirical CDF: flat to each x, then up to its y, starting from y = 0 */
};

struct html_frame {
    double w, h, l, r, t, b; /* size and margins */
    double x0, x1, y0, y1;   /* data ranges */
    bool x_integer;          /* x values are counts (concurrency, tokens): no fractional ticks */
};

static double fx(const struct html_frame *fr, double x)
{
    return fr->l + (x - fr->x0) / (fr->x1 - fr->x0) * (fr->w - fr->l - fr->r);
}

static double fy(const struct html_frame *fr, double y)
{
    return fr->h - fr->b - (y - fr->y0) / (fr->y1 - fr->y0) * (fr->h - fr->t - fr->b);
}

/* Opens the <svg>, draws title, grid, ticks and axis labels. Ranges are widened to whole tick steps. */
static void html_frame_begin(FILE *f, struct html_frame *fr, const char *id, const char *title, const char *xlabel,
                             const char *ylabel)
{
    if (!(fr->x1 > fr->x0)) {
        double d = fabs(fr->x0) > 0 ? fabs(fr->x0) * 0.1 : 1;
        fr->x0 -= d;
        fr->x1 += d;
    }
    if (!(fr->y1 > fr->y0))
        fr->y1 = fr->y0 + 1;
    double xs = html_nice_step(fr->x1 - fr->x0, 6), ys = html_nice_step(fr->y1 - fr->y0, 5);
    if (fr->x_integer && xs < 1)
        xs = 1;
    fr->x0 = floor(fr->x0 / xs) * xs;
    fr->x1 = ceil(fr->x1 / xs) * xs;
    fr->y0 = floor(fr->y0 / ys) * ys;
    fr->y1 = ceil(fr->y1 / ys) * ys;
    if (!(fr->x1 > fr->x0))
        fr->x1 = fr->x0 + xs;
    if (!(fr->y1 > fr->y0))
        fr->y1 = fr->y0 + ys;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"%s\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"", id, fr->w, fr->h, fr->w, fr->h);
    html_escape(f, title);
    fprintf(f, "\">\n<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", fr->w, fr->h);
    fprintf(f, "<text x=\"%.1f\" y=\"18\" class=\"title\">", fr->l);
    html_escape(f, title);
    fprintf(f, "</text>\n<g class=\"grid\">\n");
    char lab[32];
    for (double v = fr->x0; v <= fr->x1 + xs * 1e-6; v += xs) {
        double x = fx(fr, v);
        html_tick_label(lab, sizeof lab, v, xs);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x, fr->t, x, fr->h - fr->b);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"middle\">%s</text>\n", x,
                fr->h - fr->b + 14, lab);
    }
    for (double v = fr->y0; v <= fr->y1 + ys * 1e-6; v += ys) {
        double y = fy(fr, v);
        html_tick_label(lab, sizeof lab, v, ys);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", fr->l, y, fr->w - fr->r, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%s</text>\n", fr->l - 4, y + 4, lab);
    }
    fprintf(f, "</g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"axes\"/>\n", fr->l, fr->t,
            fr->w - fr->l - fr->r, fr->h - fr->t - fr->b);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"label\" text-anchor=\"middle\">", (fr->l + fr->w - fr->r) / 2,
            fr->h - fr->b + 30);
    html_escape(f, xlabel);
    fprintf(f, "</text>\n<text transform=\"translate(14 %.1f) rotate(-90)\" class=\"label\" text-anchor=\"middle\">",
            (fr->t + fr->h - fr->b) / 2);
    html_escape(f, ylabel);
    fprintf(f, "</text>\n");
}

static void html_no_data(FILE *f, const char *id, const char *title, double w, double h)
{
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart empty\" id=\"%s\" width=\"%.0f\" "
               "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\">\n<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" "
               "fill=\"#ffffff\"/><text x=\"12\" y=\"18\" class=\"title\">", id, w, h, w, h, w, h);
    html_escape(f, title);
    fprintf(f, "</text><text x=\"%.0f\" y=\"%.0f\" class=\"label\" text-anchor=\"middle\">no data</text></svg>\n", w / 2,
            h / 2);
}

static void html_line_chart(FILE *f, const char *id, const char *title, const char *xlabel, const char *ylabel,
                            const struct html_series *s, int ns, bool markers, bool y_from_zero)
{
    struct html_frame fr = {.w = 560, .h = 320, .l = 62, .r = 14, .t = 30, .b = 40,
                            .x0 = INFINITY, .x1 = -INFINITY, .y0 = INFINITY, .y1 = -INFINITY};
    int points = 0;
    fr.x_integer = true;
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < s[i].n; j++) {
            if (!isfinite(s[i].x[j]) || !isfinite(s[i].y[j]))
                continue;
            fr.x_integer &= s[i].x[j] == floor(s[i].x[j]);
            fr.x0 = fmin(fr.x0, s[i].x[j]);
            fr.x1 = fmax(fr.x1, s[i].x[j]);
            fr.y0 = fmin(fr.y0, s[i].y[j]);
            fr.y1 = fmax(fr.y1, s[i].y[j]);
            points++;
        }
    if (!points) {
        html_no_data(f, id, title, fr.w, fr.h);
        return;
    }
    if (y_from_zero && fr.y0 > 0)
        fr.y0 = 0;
    /* the legend goes under the x label, three entries a row, so it never hides a line */
    int legend_rows = (ns + 2) / 3;
    fr.h += 16.0 * legend_rows;
    fr.b += 16.0 * legend_rows;
    html_frame_begin(f, &fr, id, title, xlabel, ylabel);
    for (int i = 0; i < ns; i++) {
        fprintf(f, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", s[i].color,
                s[i].dashed ? " stroke-dasharray=\"6 4\"" : "");
        double prev_y = 0;
        for (int j = 0; j < s[i].n; j++) {
            if (!isfinite(s[i].x[j]) || !isfinite(s[i].y[j]))
                continue;
            if (s[i].steps)
                fprintf(f, "%.1f,%.1f ", fx(&fr, s[i].x[j]), fy(&fr, prev_y));
            fprintf(f, "%.1f,%.1f ", fx(&fr, s[i].x[j]), fy(&fr, s[i].y[j]));
            prev_y = s[i].y[j];
        }
        fprintf(f, "\"/>\n");
        for (int j = 0; markers && j < s[i].n; j++)
            if (isfinite(s[i].x[j]) && isfinite(s[i].y[j]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>", fx(&fr, s[i].x[j]),
                        fy(&fr, s[i].y[j]), s[i].color);
        if (markers)
            fprintf(f, "\n");
    }
    fprintf(f, "<g class=\"legend\">\n");
    for (int i = 0; i < ns; i++) {
        double lx = 20 + 180.0 * (i % 3), y = fr.h - 16.0 * legend_rows + 16.0 * (i / 3) + 6;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>", lx,
                y - 4, lx + 20, y - 4, s[i].color, s[i].dashed ? " stroke-dasharray=\"6 4\"" : "");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\">", lx + 26, y);
        html_escape(f, s[i].name);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</g></svg>\n");
}

static void html_histogram(FILE *f, const char *id, const char *title, const char *xlabel, const double *sorted,
                           size_t n, const char *color)
{
    struct html_frame fr = {.w = 288, .h = 220, .l = 44, .r = 10, .t = 28, .b = 40};
    if (n == 0) {
        html_no_data(f, id, title, fr.w, fr.h);
        return;
    }
    int bins = (int)ceil(sqrt((double)n));
    bins = bins < 5 ? 5 : bins > 40 ? 40 : bins;
    double lo = sorted[0], hi = sorted[n - 1];
    if (!(hi > lo)) {
        double d = fabs(lo) > 0 ? fabs(lo) * 0.05 : 0.5;
        lo -= d;
        hi += d;
    }
    int counts[40] = {0}, top = 0;
    double width = (hi - lo) / bins;
    for (size_t i = 0; i < n; i++) {
        int b = (int)((sorted[i] - lo) / width);
        b = b < 0 ? 0 : b >= bins ? bins - 1 : b;
        counts[b]++;
    }
    for (int b = 0; b < bins; b++)
        top = counts[b] > top ? counts[b] : top;
    fr.x0 = lo;
    fr.x1 = hi;
    fr.y0 = 0;
    fr.y1 = top;
    html_frame_begin(f, &fr, id, title, xlabel, "requests");
    for (int b = 0; b < bins; b++) {
        if (!counts[b])
            continue;
        double x0 = fx(&fr, lo + b * width), x1 = fx(&fr, lo + (b + 1) * width), y = fy(&fr, counts[b]);
        fprintf(f, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>", x0, y,
                fmax(x1 - x0 - 1, 1), fy(&fr, 0) - y, color);
    }
    fprintf(f, "\n</svg>\n");
}

static const char *html_metric_names[4] = {"TTFT", "TPOT", "ITL", "E2E"};
static const char *html_metric_ids[4] = {"ttft", "tpot", "itl", "e2e"};

static const struct serve_metric *html_metric(const struct serve_run_summary *s, int k)
{
    return k == 0 ? &s->ttft : k == 1 ? &s->tpot : k == 2 ? &s->itl : &s->e2e;
}

/* The CDF of each run's samples for metric k, at most 400 points per line. */
static void html_cdf_chart(FILE *f, const struct serve_report *rep, int k)
{
    int ns = rep->n_runs;
    struct html_series *s = calloc((size_t)(ns ? ns : 1), sizeof *s);
    double **xs = calloc((size_t)(ns ? ns : 1), sizeof *xs), **ys = calloc((size_t)(ns ? ns : 1), sizeof *ys);
    if (!s || !xs || !ys)
        goto out;
    for (int i = 0; i < ns; i++) {
        const struct serve_metric *m = html_metric(&rep->runs[i].s, k);
        size_t n = m->s.n, pts = n < 400 ? n : 400;
        xs[i] = malloc((pts ? pts : 1) * sizeof(double));
        ys[i] = malloc((pts ? pts : 1) * sizeof(double));
        if (!xs[i] || !ys[i])
            goto out;
        for (size_t j = 0; j < pts; j++) {
            size_t idx = pts == n ? j : (size_t)((double)j * (double)(n - 1) / (double)(pts - 1));
            xs[i][j] = m->values[idx];
            ys[i][j] = 100.0 * (double)(idx + 1) / (double)n;
        }
        serve_report_run_name(&rep->runs[i], s[i].name, sizeof s[i].name);
        s[i].x = xs[i];
        s[i].y = ys[i];
        s[i].n = (int)pts;
        s[i].color = html_colors[i % HTML_N_COLORS];
        s[i].steps = true;
    }
    char id[32], title[64], xl[32];
    snprintf(id, sizeof id, "chart-cdf-%s", html_metric_ids[k]);
    snprintf(title, sizeof title, "%s distribution (CDF)", html_metric_names[k]);
    snprintf(xl, sizeof xl, "%s (ms)", html_metric_names[k]);
    html_line_chart(f, id, title, xl, "% of samples at or below", s, ns, false, true);
out:
    for (int i = 0; xs && ys && i < ns; i++) {
        free(xs[i]);
        free(ys[i]);
    }
    free(xs);
    free(ys);
    free(s);
}

static double html_load(const struct serve_run *r) { return r->concurrency > 0 ? r->concurrency : r->request_rate; }

static int html_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Distinct finite values of v[0..n) sorted into out; returns their count. */
static int html_distinct(const double *v, int n, double *out)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            continue;
        bool seen = false;
        for (int j = 0; j < k; j++)
            seen |= out[j] == v[i];
        if (!seen)
            out[k++] = v[i];
    }
    qsort(out, (size_t)k, sizeof *out, html_cmp_double);
    return k;
}

/* What a sweep chart plots for a run. */
enum html_field { HF_REQ_TPUT, HF_OUT_TPUT, HF_TTFT_P50, HF_TTFT_P99, HF_TPOT_P50, HF_TPOT_P99, HF_E2E_P50, HF_E2E_P99 };

static double html_field(const struct serve_run *r, int fld)
{
    const struct serve_run_summary *s = &r->s;
    switch (fld) {
    case HF_REQ_TPUT: return s->request_throughput;
    case HF_OUT_TPUT: return s->output_throughput;
    case HF_TTFT_P50: return s->ttft.s.p50;
    case HF_TTFT_P99: return s->ttft.s.p99;
    case HF_TPOT_P50: return s->tpot.s.p50;
    case HF_TPOT_P99: return s->tpot.s.p99;
    case HF_E2E_P50: return s->e2e.s.p50;
    default: return s->e2e.s.p99;
    }
}

/* One chart with x = load (or input length when by_input), a line per (group, field). */
static void html_sweep_chart(FILE *f, const struct serve_report *rep, const char *id, const char *title,
                             const char *xlabel, const char *ylabel, const int *fields, const char *const *field_names,
                             int nf, bool by_input)
{
    int n = rep->n_runs;
    double *xv = malloc((size_t)n * sizeof *xv), *gv = malloc((size_t)n * sizeof *gv);
    double *groups = malloc((size_t)n * sizeof *groups);
    struct html_series *s = calloc((size_t)n * (size_t)nf, sizeof *s);
    double *px = malloc((size_t)n * (size_t)nf * sizeof *px), *py = malloc((size_t)n * (size_t)nf * sizeof *py);
    if (!xv || !gv || !groups || !s || !px || !py)
        goto out;
    for (int i = 0; i < n; i++) {
        xv[i] = by_input ? rep->runs[i].input_len : html_load(&rep->runs[i]);
        gv[i] = by_input ? html_load(&rep->runs[i]) : rep->runs[i].input_len;
    }
    int ng = html_distinct(gv, n, groups), ns = 0, used = 0;
    for (int g = 0; g < ng; g++) {
        for (int fi = 0; fi < nf; fi++) {
            struct html_series *se = &s[ns];
            se->x = px + used;
            se->y = py + used;
            /* runs of this group, in order of x */
            double xs_sorted[SERVE_LIST_MAX * SERVE_LIST_MAX];
            int cnt = 0;
            for (int i = 0; i < n && cnt < (int)(sizeof xs_sorted / sizeof xs_sorted[0]); i++)
                if (gv[i] == groups[g] && isfinite(xv[i]))
                    xs_sorted[cnt++] = xv[i];
            qsort(xs_sorted, (size_t)cnt, sizeof(double), html_cmp_double);
            for (int c = 0; c < cnt; c++) {
                for (int i = 0; i < n; i++) {
                    if (gv[i] == groups[g] && xv[i] == xs_sorted[c]) {
                        px[used] = xv[i];
                        py[used] = html_field(&rep->runs[i], fields[fi]);
                        used++;
                        se->n++;
                        break;
                    }
                }
            }
            char gname[48] = "";
            if (ng > 1 || by_input) {
                if (by_input)
                    snprintf(gname, sizeof gname, rep->runs[0].concurrency > 0 ? "conc %g " : "rate %g ", groups[g]);
                else
                    snprintf(gname, sizeof gname, "input %g ", groups[g]);
            }
            snprintf(se->name, sizeof se->name, "%s%s", gname, field_names[fi]);
            se->color = html_colors[g % HTML_N_COLORS];
            se->dashed = fi % 2 == 1;
            if (nf == 1 || ng == 1)
                se->color = html_colors[(ng == 1 ? fi : g) % HTML_N_COLORS], se->dashed = false;
            ns++;
        }
    }
    html_line_chart(f, id, title, xlabel, ylabel, s, ns, true, true);
out:
    free(xv);
    free(gv);
    free(groups);
    free(s);
    free(px);
    free(py);
}

static void html_sweep(FILE *f, const struct serve_report *rep)
{
    int n = rep->n_runs;
    double loads[SERVE_LIST_MAX * SERVE_LIST_MAX], lens[SERVE_LIST_MAX * SERVE_LIST_MAX], tmp[SERVE_LIST_MAX * SERVE_LIST_MAX];
    int m = n < (int)(sizeof loads / sizeof loads[0]) ? n : (int)(sizeof loads / sizeof loads[0]);
    for (int i = 0; i < m; i++) {
        tmp[i] = html_load(&rep->runs[i]);
        lens[i] = rep->runs[i].input_len > 0 ? rep->runs[i].input_len : NAN;
    }
    int n_loads = html_distinct(tmp, m, loads);
    int n_lens = html_distinct(lens, m, tmp);
    if (n_loads < 2 && n_lens < 2)
        return;
    bool rate = rep->runs[0].concurrency == 0;
    const char *xl = rate ? "request rate (req/s)" : "concurrency (requests in flight)";
    fprintf(f, "<h2>Sweep</h2>\n<div class=\"charts\">\n");
    if (n_loads >= 2) {
        static const int tput_out[] = {HF_OUT_TPUT}, tput_req[] = {HF_REQ_TPUT};
        static const char *const tput_out_n[] = {"output tok/s"}, *const tput_req_n[] = {"req/s"};
        static const int ttft[] = {HF_TTFT_P50, HF_TTFT_P99}, tpot[] = {HF_TPOT_P50, HF_TPOT_P99},
                         e2e[] = {HF_E2E_P50, HF_E2E_P99};
        static const char *const ttft_n[] = {"TTFT p50", "TTFT p99"}, *const tpot_n[] = {"TPOT p50", "TPOT p99"},
                                 *const e2e_n[] = {"E2E p50", "E2E p99"};
        html_sweep_chart(f, rep, "chart-sweep-output-throughput", rate ? "Output throughput vs request rate" :
                         "Output throughput vs concurrency", xl, "output tokens/s", tput_out, tput_out_n, 1, false);
        html_sweep_chart(f, rep, "chart-sweep-request-throughput", rate ? "Request throughput vs request rate" :
                         "Request throughput vs concurrency", xl, "requests/s", tput_req, tput_req_n, 1, false);
        html_sweep_chart(f, rep, "chart-sweep-ttft", rate ? "TTFT vs request rate" : "TTFT vs concurrency", xl, "ms",
                         ttft, ttft_n, 2, false);
        html_sweep_chart(f, rep, "chart-sweep-tpot", rate ? "TPOT vs request rate" : "TPOT vs concurrency", xl, "ms",
                         tpot, tpot_n, 2, false);
        html_sweep_chart(f, rep, "chart-sweep-e2e", rate ? "E2E latency vs request rate" : "E2E latency vs concurrency",
                         xl, "ms", e2e, e2e_n, 2, false);
    }
    if (n_lens >= 2) {
        static const int ttft[] = {HF_TTFT_P50, HF_TTFT_P99};
        static const char *const ttft_n[] = {"TTFT p50", "TTFT p99"};
        html_sweep_chart(f, rep, "chart-ttft-vs-input", "TTFT vs prompt length", "prompt length (tokens)", "ms", ttft,
                         ttft_n, 2, true);
    }
    fprintf(f, "</div>\n");
}

static void html_cell_num(FILE *f, double v, int decimals)
{
    if (isfinite(v))
        fprintf(f, "<td>%.*f</td>", decimals, v);
    else
        fprintf(f, "<td>-</td>");
}

/* Conversations (--turns): a table per run and two charts by turn, one line per run. */
static void html_turns(FILE *f, const struct serve_report *rep)
{
    int n_turns = 0;
    for (int i = 0; i < rep->n_runs; i++)
        n_turns = rep->runs[i].s.n_turns > n_turns ? rep->runs[i].s.n_turns : n_turns;
    if (n_turns < 2)
        return;
    int m = rep->n_runs < (int)HTML_N_COLORS ? rep->n_runs : (int)HTML_N_COLORS;
    double *buf = malloc((size_t)n_turns * 3 * (size_t)(m > 0 ? m : 1) * sizeof *buf);
    struct html_series ttft[HTML_N_COLORS], hit[HTML_N_COLORS];
    if (!buf)
        return; /* the page is complete without this section */
    fprintf(f, "<h2>Conversations</h2>\n<p class=\"note\">Each turn resends the conversation so far; "
               "\"cached\" is the share of its prompt tokens the server's prefix cache served "
               "(usage.prompt_tokens_details.cached_tokens).</p>\n<div class=\"charts\">\n");
    for (int i = 0; i < m; i++) {
        const struct serve_run_summary *s = &rep->runs[i].s;
        double *x = buf + (size_t)i * 3 * (size_t)n_turns, *yt = x + n_turns, *yh = yt + n_turns;
        for (int t = 0; t < n_turns; t++) {
            const struct serve_turn_summary *u = t < s->n_turns ? &s->turns[t] : NULL;
            x[t] = t + 1;
            yt[t] = u ? u->ttft.p50 : NAN;
            yh[t] = u ? 100.0 * serve_hit_rate(u->cached_tokens, u->cached_of_input) : NAN;
        }
        serve_report_run_name(&rep->runs[i], ttft[i].name, sizeof ttft[i].name);
        ttft[i].x = hit[i].x = x;
        ttft[i].y = yt;
        hit[i].y = yh;
        ttft[i].n = hit[i].n = n_turns;
        ttft[i].color = hit[i].color = html_colors[i];
        ttft[i].dashed = hit[i].dashed = ttft[i].steps = hit[i].steps = false;
        memcpy(hit[i].name, ttft[i].name, sizeof hit[i].name);
    }
    html_line_chart(f, "chart-turns-ttft", "TTFT p50 by turn", "turn", "ms", ttft, m, true, true);
    html_line_chart(f, "chart-turns-cached", "Prompt tokens from the prefix cache by turn", "turn", "% of the prompt",
                    hit, m, true, true);
    free(buf);
    fprintf(f, "</div>\n<div class=\"scroll\"><table id=\"turns\"><thead><tr><th>run</th><th>turn</th><th>sent</th>"
               "<th>completed</th><th>mean input tokens</th><th>cached %%</th><th>TTFT mean</th><th>TTFT p50</th>"
               "<th>TTFT p95</th></tr></thead><tbody>\n");
    for (int i = 0; i < rep->n_runs; i++) {
        const struct serve_run_summary *s = &rep->runs[i].s;
        char name[96];
        serve_report_run_name(&rep->runs[i], name, sizeof name);
        for (int t = 0; t < s->n_turns; t++) {
            const struct serve_turn_summary *u = &s->turns[t];
            fprintf(f, "<tr><th>");
            html_escape(f, name);
            fprintf(f, "</th><td>%d</td><td>%d</td><td%s>%d</td>", t + 1, u->sent,
                    u->completed < u->sent ? " class=\"bad\"" : "", u->completed);
            html_cell_num(f, u->completed ? (double)u->input_tokens / u->completed : NAN, 1);
            html_cell_num(f, 100.0 * serve_hit_rate(u->cached_tokens, u->cached_of_input), 1);
            html_cell_num(f, u->ttft.mean, 1);
            html_cell_num(f, u->ttft.p50, 1);
            html_cell_num(f, u->ttft.p95, 1);
            fprintf(f, "</tr>\n");
        }
    }
    fprintf(f, "</tbody></table></div>\n");
}

static void html_summary_table(FILE *f, const struct serve_report *rep)
{
    bool cost = false, good = false;
    for (int i = 0; i < rep->n_runs; i++) {
        cost |= rep->runs[i].s.has_cost;
        good |= rep->runs[i].s.has_goodput;
    }
    fprintf(f, "<div class=\"scroll\"><table id=\"summary\"><thead><tr><th>run</th><th>completed</th><th>failed</th><th>duration s</th>"
               "<th>req/s</th><th>output tok/s</th><th>total tok/s</th><th>TTFT p50</th><th>TTFT p99</th>"
               "<th>TPOT p50</th><th>TPOT p99</th><th>ITL p50</th><th>ITL p99</th><th>E2E p50</th><th>E2E p99</th>%s%s"
               "</tr></thead><tbody>\n", good ? "<th>goodput req/s</th>" : "",
            cost ? "<th>$ / request</th><th>$ / 1M output tok</th>" : "");
    for (int i = 0; i < rep->n_runs; i++) {
        const struct serve_run *r = &rep->runs[i];
        const struct serve_run_summary *s = &r->s;
        char name[96];
        serve_report_run_name(r, name, sizeof name);
        fprintf(f, "<tr><th>");
        html_escape(f, name);
        fprintf(f, "</th><td>%d</td><td%s>%d</td>", s->completed, s->failed ? " class=\"bad\"" : "", s->failed);
        html_cell_num(f, s->duration_s, 2);
        html_cell_num(f, s->request_throughput, 2);
        html_cell_num(f, s->output_throughput, 1);
        html_cell_num(f, s->total_token_throughput, 1);
        html_cell_num(f, s->ttft.s.p50, 1);
        html_cell_num(f, s->ttft.s.p99, 1);
        html_cell_num(f, s->tpot.s.p50, 2);
        html_cell_num(f, s->tpot.s.p99, 2);
        html_cell_num(f, s->itl.s.p50, 2);
        html_cell_num(f, s->itl.s.p99, 2);
        html_cell_num(f, s->e2e.s.p50, 1);
        html_cell_num(f, s->e2e.s.p99, 1);
        if (good)
            html_cell_num(f, s->has_goodput ? s->request_goodput : NAN, 2);
        if (cost) {
            html_cell_num(f, s->has_cost ? s->usd_per_request : NAN, 6);
            html_cell_num(f, s->has_cost ? s->usd_per_million_output_tokens : NAN, 4);
        }
        fprintf(f, "</tr>\n");
    }
    fprintf(f, "</tbody></table></div>\n<p class=\"note\">Latencies in milliseconds.</p>\n");
}

static void html_errors(FILE *f, const struct serve_report *rep)
{
    bool any = false;
    for (int i = 0; i < rep->n_runs; i++)
        any |= rep->runs[i].s.failed > 0;
    if (!any)
        return;
    fprintf(f, "<h2>Errors</h2>\n<table id=\"errors\"><thead><tr><th>run</th>");
    for (int k = 1; k < SERVE_OUTCOME_COUNT; k++)
        fprintf(f, "<th>%s</th>", serve_outcome_name(k));
    fprintf(f, "<th>first messages</th></tr></thead><tbody>\n");
    for (int i = 0; i < rep->n_runs; i++) {
        const struct serve_run_summary *s = &rep->runs[i].s;
        if (!s->failed)
            continue;
        char name[96];
        serve_report_run_name(&rep->runs[i], name, sizeof name);
        fprintf(f, "<tr><th>");
        html_escape(f, name);
        fprintf(f, "</th>");
        for (int k = 1; k < SERVE_OUTCOME_COUNT; k++)
            fprintf(f, "<td>%d</td>", s->by_outcome[k]);
        fprintf(f, "<td class=\"msg\">");
        for (int k = 1; k < SERVE_OUTCOME_COUNT; k++) {
            if (!s->error_sample[k])
                continue;
            fprintf(f, "<div><b>%s</b>: ", serve_outcome_name(k));
            html_escape(f, s->error_sample[k]);
            fprintf(f, "</div>");
        }
        fprintf(f, "</td></tr>\n");
    }
    fprintf(f, "</tbody></table>\n");
}

static void html_quality(FILE *f, const struct serve_quality *q)
{
    fprintf(f, "<h2>Quality</h2>\n<p>");
    html_escape(f, q->path);
    fprintf(f, ": overall score <b>%.3f</b> (mean of the case scores; a case scores the fraction of its expected "
               "keywords found in the answer)</p>\n<table id=\"quality\"><thead><tr><th>#</th><th>score</th>"
               "<th>prompt</th><th>missing keywords</th></tr></thead><tbody>\n", q->score);
    for (int i = 0; i < q->cases.n; i++) {
        const struct serve_prompt *p = &q->cases.items[i];
        const struct serve_quality_case *c = &q->results[i];
        fprintf(f, "<tr><td>%d</td><td>%.2f</td><td class=\"msg\">", i + 1, c->score);
        html_escape(f, p->text);
        fprintf(f, "</td><td class=\"msg\">");
        if (c->outcome != SERVE_OK) {
            fprintf(f, "request failed: ");
            html_escape(f, c->error);
        }
        for (int k = 0; c->outcome == SERVE_OK && k < p->n_keywords; k++) {
            if (c->found[k])
                continue;
            fprintf(f, "&quot;");
            html_escape(f, p->keywords[k]);
            fprintf(f, "&quot; ");
        }
        fprintf(f, "</td></tr>\n");
    }
    fprintf(f, "</tbody></table>\n");
}

int serve_report_write_html(const struct serve_report *rep, const char *path, char *err)
{
    const struct serve_options *o = rep->opt;
    FILE *f = fopen(path, "w");
    if (!f)
        return err_set(err, ERR_IO, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>wafer bench serve: ");
    html_escape(f, rep->label);
    fprintf(f, "</title>\n<style>\n"
               "body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px;color:#222;"
               "background:#fafafa}\n"
               "h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:28px 0 8px}h3{font-size:14px;margin:16px 0 6px}\n"
               ".meta{color:#555;font-size:13px;margin:2px 0}.note{color:#666;font-size:12px}\n"
               ".scroll{overflow-x:auto}table{border-collapse:collapse;font-size:13px;background:#fff}"
               "th,td{padding:4px 8px;border-bottom:1px solid #e2e2e2;text-align:right;white-space:nowrap}"
               "thead th{background:#f0f0f0}tbody th{text-align:left}td.msg{text-align:left;white-space:normal;"
               "max-width:640px}td.bad{color:#b00020;font-weight:600}\n"
               ".charts{display:flex;flex-wrap:wrap;gap:12px}svg.chart{border:1px solid #e0e0e0;border-radius:4px}\n"
               "svg .title{font-size:13px;font-weight:600;fill:#222}svg .tick{font-size:10px;fill:#555}"
               "svg .label{font-size:11px;fill:#333}svg .grid line{stroke:#ececec;stroke-width:1}"
               "svg .axes{fill:none;stroke:#999}\n"
               "</style>\n</head>\n<body>\n<h1>wafer bench serve: ");
    html_escape(f, rep->label);
    fprintf(f, "</h1>\n<p class=\"meta\">model <b>");
    html_escape(f, rep->model ? rep->model : "(not sent)");
    fprintf(f, "</b> at <code>");
    html_escape(f, rep->endpoint_url);
    fprintf(f, "</code> (%s endpoint), started %s UTC</p>\n<p class=\"meta\">",
            o->endpoint == SERVE_ENDPOINT_CHAT ? "chat" : "completions", rep->started_at);
    if (o->dataset) {
        fprintf(f, "prompts from ");
        html_escape(f, o->dataset);
    } else {
        fprintf(f, "synthetic prompts (random words, %.2f tokens per word%s), output %d tokens", rep->tokens_per_word,
                rep->calibrated ? ", calibrated with /tokenize" : "", o->output_len);
    }
    int sent = rep->n_runs ? rep->runs[0].s.sent : 0;
    if (o->turns > 1)
        fprintf(f, ", %d conversations of %d turns", sent / o->turns, o->turns);
    fprintf(f, ", %d requests per run, seed %llu, timeout %g s%s</p>\n", sent,
            (unsigned long long)o->seed, o->timeout_s, o->ignore_eos ? ", ignore_eos" : "");
    if (rep->n_runs > 0) {
        fprintf(f, "<h2>Summary</h2>\n");
        html_summary_table(f, rep);
        html_sweep(f, rep);
        html_turns(f, rep);
        fprintf(f, "<h2>Latency distributions</h2>\n<div class=\"charts\">\n");
        for (int k = 0; k < 4; k++)
            html_cdf_chart(f, rep, k);
        fprintf(f, "</div>\n<h2>Histograms</h2>\n");
        for (int i = 0; i < rep->n_runs; i++) {
            char name[96];
            serve_report_run_name(&rep->runs[i], name, sizeof name);
            fprintf(f, "<h3>");
            html_escape(f, name);
            fprintf(f, "</h3>\n<div class=\"charts\">\n");
            for (int k = 0; k < 4; k++) {
                char id[48], title[48], xl[32];
                const struct serve_metric *m = html_metric(&rep->runs[i].s, k);
                snprintf(id, sizeof id, "chart-hist-%d-%s", i + 1, html_metric_ids[k]);
                snprintf(title, sizeof title, "%s (n=%zu)", html_metric_names[k], m->s.n);
                snprintf(xl, sizeof xl, "%s (ms)", html_metric_names[k]);
                html_histogram(f, id, title, xl, m->values, m->s.n, html_colors[k]);
            }
            fprintf(f, "</div>\n");
        }
        html_errors(f, rep);
    }
    if (rep->quality)
        html_quality(f, rep->quality);
    fprintf(f, "<p class=\"note\">TTFT: send to first streamed token. ITL: every gap between streamed chunks. "
               "TPOT: (E2E - TTFT) / (output tokens - 1). E2E: send to end of stream. Output tokens come from the "
               "server's usage when it reports it. Percentiles interpolate linearly between samples, like numpy's "
               "default. Made by wafer bench serve.</p>\n</body>\n</html>\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return err_set(err, ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return 0;
}
