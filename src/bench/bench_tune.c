/*
 * bench_tune: `wafer bench --tune` (bench_tune.h). Each type's rules run in one gemv_stream measurement (its
 * rounds alternate a plain read with a pass under each rule, the built-in rule first), so the choice compares
 * rules within the same minutes; the figures behind each choice go into the tune file beside it, so a later
 * reader can see how close it was.
 */
#include "bench/bench_tune.h"

#include "bench/gemv_stream.h"
#include "bench/membw.h"
#include "core/err.h"
#include "core/sysinfo.h"
#include "engine/cpu/cpu_features.h"
#include "engine/cpu/cpu_tune.h"
#include "engine/dtype.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Marks in want[] the types of the comma-separated list s (NULL: all). -1 naming the first bad one in err. */
static int bench_tune_types(const char *s, bool want[CPU_PREFETCH_N_TYPES], char *err)
{
    for (int i = 0; i < CPU_PREFETCH_N_TYPES; i++)
        want[i] = s == NULL;
    while (s && *s) {
        const char *e = strchr(s, ',');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        char name[16];
        enum dtype t;
        bool found = false;
        if (n > 0 && n < sizeof name) {
            memcpy(name, s, n);
            name[n] = '\0';
            if (!dtype_from_name(name, &t))
                for (int i = 0; i < CPU_PREFETCH_N_TYPES; i++)
                    if (cpu_decode_prefetch_types[i] == t)
                        want[i] = found = true;
        }
        if (!found)
            return err_set(err, -1, "--tune-types: '%.*s' is not one of q4_0, q8_0, q4_k, q6_k, f16", (int)n, s);
        s = e ? e + 1 : s + n;
    }
    return 0;
}

int bench_tune_run(const struct bench_tune_opts *o)
{
    char err[ERR_MSG_MAX], cpu[256], path[512] = "";
    bool want[CPU_PREFETCH_N_TYPES];
    cpu_tune_hint_off();
    if (bench_tune_types(o->types, want, err)) {
        fprintf(stderr, "wafer bench: %s\n", err);
        return 2;
    }
    if (!kernel_cpu_has_avx2()) {
        fprintf(stderr, "wafer bench: --tune: this CPU runs the portable scalar kernels (no AVX2, or WAFER_NO_SIMD), "
                        "which have no prefetch rules to choose\n");
        return 2;
    }
    if (cpu_decode_prefetch_env()) {
        fprintf(stderr, "wafer bench: --tune: WAFER_GEMV_PREFETCH or WAFER_PREFETCH_NTA in the environment decides "
                        "the prefetch rules; unset them to measure the rules\n");
        return 2;
    }
    if (o->save) {
        if (o->path)
            snprintf(path, sizeof path, "%s", o->path);
        else if (!cpu_tune_path(path, sizeof path)) {
            fprintf(stderr, "wafer bench: --tune: no place for the tune file (WAFER_TUNE_FILE is empty, or neither "
                            "XDG_CACHE_HOME nor HOME is set); give --tune-file PATH or --no-save\n");
            return 2;
        }
    }
    int rounds = o->rounds > 0 ? o->rounds : 10, rules[DTYPE_COUNT], threads = 0;
    for (int t = 0; t < DTYPE_COUNT; t++)
        rules[t] = -1;
    sysinfo_cpu_name(cpu, sizeof cpu);
    json_t *fig = json_object(), *res = json_object();
    if (!fig || !res) {
        json_decref(fig);
        json_decref(res);
        fprintf(stderr, "wafer bench: out of memory\n");
        return 1;
    }
    int rc = 1;
    /* the core round trip before and after: on a VM whose vCPUs move between chiplets (the Zen 5 of
     * docs/performance.md) it says whether the whole measurement saw one placement */
    double rtt0 = 0, rtt1 = 0;
    if (membw_round_trip_ns(0, &rtt0, err))
        rtt0 = 0;
    printf("decode prefetch rules on %s, %s kernels: the 1B model's matrices from memory, %d rounds of a plain read "
           "then each rule (GB/s, medians; vs built-in: the median round's built-in time / the rule's)\n",
           cpu, cpu_tune_isa(), rounds);
    printf("%-6s %9s   %-48s %-8s %-8s %s\n", "type", "read", "rules (GB/s, vs built-in)", "built-in", "chosen",
           "gain");
    for (int i = 0; i < CPU_PREFETCH_N_TYPES; i++) {
        enum dtype t = cpu_decode_prefetch_types[i];
        enum cpu_prefetch cand[CPU_PREFETCH_COUNT];
        int k = want[i] ? cpu_decode_prefetch_candidates(t, cand) : 0;
        if (k < 2)
            continue;
        if (k > GEMV_STREAM_MAX_RULES) { /* a rule added to cpu_features.h without room here */
            fprintf(stderr, "wafer bench: --tune: %s has %d rules, more than the %d a run measures\n", dtype_name(t), k,
                    GEMV_STREAM_MAX_RULES);
            goto out;
        }
        struct gemv_stream_opts so;
        struct gemv_stream_result r;
        gemv_stream_opts_default(&so, t);
        so.n_threads = o->threads;
        so.passes = rounds;
        so.n_rules = k;
        for (int q = 0; q < k; q++)
            so.rules[q] = cand[q];
        fprintf(stderr, "tuning %s: %d rules, %d rounds...\n", dtype_name(t), k, rounds);
        int src = gemv_stream_run(&so, &r, err);
        if (src) {
            fprintf(stderr, "wafer bench: --tune: %s\n", err);
            rc = src == ERR_INVALID_ARG ? 2 : 1;
            goto out;
        }
        threads = r.threads;
        int best = 0;
        for (int q = 1; q < k; q++)
            if (r.rule_vs_first[q] >= 1 + BENCH_TUNE_MARGIN && r.rule_vs_first[q] > r.rule_vs_first[best])
                best = q;
        rules[t] = cand[best];
        char cells[128] = "";
        size_t at = 0;
        json_t *f = json_object(), *g = json_object(), *v = json_object();
        for (int q = 0; q < k && at < sizeof cells; q++) {
            int w = snprintf(cells + at, sizeof cells - at, "%s%s %.1f (%.2f)", q ? ", " : "",
                             cpu_prefetch_name(cand[q]), r.rule_gbs[q], r.rule_vs_first[q]);
            at += w > 0 ? (size_t)w : 0;
            json_object_set_new(g, cpu_prefetch_name(cand[q]), json_real(r.rule_gbs[q]));
            json_object_set_new(v, cpu_prefetch_name(cand[q]), json_real(r.rule_vs_first[q]));
        }
        printf("%-6s %9.1f   %-48s %-8s %-8s %.2fx\n", dtype_name(t), r.read_gbs, cells, cpu_prefetch_name(cand[0]),
               cpu_prefetch_name(cand[best]), r.rule_vs_first[best]);
        fflush(stdout);
        json_object_set_new(f, "read_gbs", json_real(r.read_gbs));
        json_object_set_new(f, "rule_gbs", g);
        json_object_set_new(f, "vs_builtin", v);
        json_object_set_new(f, "builtin", json_string(cpu_prefetch_name(cand[0])));
        json_object_set_new(f, "chosen", json_string(cpu_prefetch_name(cand[best])));
        json_object_set_new(f, "rounds", json_integer(rounds));
        json_object_set_new(fig, dtype_name(t), f);
    }
    if (json_object_size(fig) == 0) {
        fprintf(stderr, "wafer bench: --tune: no type asked for has a choice of rules with these kernels\n");
        rc = 2;
        goto out;
    }
    if (membw_round_trip_ns(0, &rtt1, err))
        rtt1 = 0;
    if (rtt0 > 0 && rtt1 > 0) {
        printf("core round trip: %.0f ns before, %.0f ns after (a cache line between the first two cores and back)\n",
               rtt0, rtt1);
        if (rtt0 > 1.8 * rtt1 || rtt1 > 1.8 * rtt0)
            printf("the cores' placement changed while this ran (a VM moved between chiplets?): run it again and "
                   "see whether the choices hold\n");
        json_t *rt = json_array();
        json_array_append_new(rt, json_real(rtt0));
        json_array_append_new(rt, json_real(rtt1));
        json_object_set_new(res, "core_round_trip_ns", rt);
    }
    if (o->save) {
        char *ftxt = json_dumps(fig, JSON_COMPACT | JSON_PRESERVE_ORDER);
        int wrc = ftxt ? cpu_tune_write(path, rules, threads, ftxt, err) : err_set(err, ERR_IO, "out of memory");
        free(ftxt);
        if (wrc) {
            fprintf(stderr, "wafer bench: --tune: %s\n", err);
            goto out;
        }
        printf("wrote %s: wafer processes on this CPU (%s, %s kernels) now decode with these rules "
               "(WAFER_TUNE_FILE= in the environment turns it off)\n", path, cpu, cpu_tune_isa());
    } else {
        printf("not saved (--no-save)\n");
    }
    if (o->json) {
        json_object_set_new(res, "cpu", json_string(cpu));
        json_object_set_new(res, "isa", json_string(cpu_tune_isa()));
        json_object_set_new(res, "threads", json_integer(threads));
        json_object_set_new(res, "rounds", json_integer(rounds));
        json_object_set_new(res, "tune_file", o->save ? json_string(path) : json_null());
        json_object_set(res, "types", fig);
        char *txt = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!txt)
            goto out;
        printf("%s\n", txt);
        free(txt);
    }
    rc = 0;
out:
    json_decref(fig);
    json_decref(res);
    return rc;
}
