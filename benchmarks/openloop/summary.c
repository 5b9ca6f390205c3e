/* The JSON summary: accounting over the whole run, rates and percentiles over the measured
 * window (requests whose intended time is past the warm-up).
 *
 * Every offered request ends as exactly one of: completed (any status), timed out, failed
 * (error), or expired in the generator's queue (never sent); sent = completed + timeouts + errors.
 * "ok" is a 2xx answer or gRPC OK; "refused" is 429/503 or gRPC RESOURCE_EXHAUSTED/UNAVAILABLE.
 */
#include "openloop.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>


static bool is_ok(int s) { return (s >= 200 && s < 300) || s == 1000; }
static bool is_refused(int s) { return s == 429 || s == 503 || s == 1008 || s == 1014; }

static int cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void percentiles(FILE *out, const char *name, int64_t *v, size_t n, bool comma) {
    fprintf(out, "    \"%s\": ", name);
    if (n == 0) {
        fprintf(out, "null%s\n", comma ? "," : "");
        return;
    }
    qsort(v, n, sizeof *v, cmp);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)v[i];
    static const double ps[] = {0.5, 0.9, 0.99, 0.999};
    static const char *names[] = {"p50", "p90", "p99", "p999"};
    fprintf(out, "{\"count\": %zu, \"mean\": %.3f", n, sum / (double)n / 1e6);
    for (int i = 0; i < 4; i++) {
        size_t k = (size_t)(ps[i] * (double)n);
        fprintf(out, ", \"%s\": %.3f", names[i], (double)v[k < n ? k : n - 1] / 1e6);
    }
    fprintf(out, ", \"max\": %.3f}%s\n", (double)v[n - 1] / 1e6, comma ? "," : "");
}

/* Count of each status (> 0) among the records that ``take`` selects, as a JSON object. */
static void statuses(FILE *out, const Gen *g, int64_t from) {
    int *counts = calloc(2100, sizeof(int));
    for (size_t i = 0; i < g->nreq; i++) {
        const Req *r = &g->reqs[i];
        if (r->intended >= from && r->status > 0 && r->status < 2100) counts[r->status]++;
    }
    fprintf(out, "{");
    const char *sep = "";
    for (int s = 1; s < 2100; s++) {
        if (!counts[s]) continue;
        fprintf(out, "%s\"%d\": %d", sep, s, counts[s]);
        sep = ", ";
    }
    fprintf(out, "}");
    free(counts);
}

typedef struct {
    size_t offered, sent, completed, ok, refused, timeouts, errors, expired;
} Counts;

static Counts count(const Gen *g, int64_t from) {
    Counts k = {0};
    for (size_t i = 0; i < g->nreq; i++) {
        const Req *r = &g->reqs[i];
        if (r->intended < from) continue;
        k.offered++;
        k.sent += r->sent != 0;
        k.completed += r->status > 0;
        k.ok += is_ok(r->status);
        k.refused += is_refused(r->status);
        k.timeouts += r->status == ST_TIMEOUT;
        k.errors += r->status == ST_ERROR || r->status == ST_PENDING;
        k.expired += r->status == ST_EXPIRED;
    }
    return k;
}

static void counts(FILE *out, const char *indent, Counts k) {
    fprintf(out,
            "%s\"offered\": %zu, \"sent\": %zu, \"completed\": %zu, \"ok\": %zu, \"refused\": %zu,\n"
            "%s\"timeouts\": %zu, \"errors\": %zu, \"expired_in_queue\": %zu,\n",
            indent, k.offered, k.sent, k.completed, k.ok, k.refused, indent, k.timeouts, k.errors,
            k.expired);
}

void write_summary(const Gen *g, FILE *out, const char *arrivals) {
    int64_t from = (int64_t)(g->warmup_s * 1e9);
    double seconds = g->duration_s - g->warmup_s;
    if (g->closed_loop && g->nreq) from = from < g->reqs[g->nreq - 1].intended ? from : 0;
    int64_t *ok = malloc((g->nreq + 1) * sizeof(int64_t)), *refused = malloc((g->nreq + 1) * sizeof(int64_t));
    int64_t *service = malloc((g->nreq + 1) * sizeof(int64_t)), *lag = malloc((g->nreq + 1) * sizeof(int64_t));
    size_t nok = 0, nref = 0, nlag = 0;
    for (size_t i = 0; i < g->nreq; i++) {
        const Req *r = &g->reqs[i];
        if (r->intended < from) continue;
        if (r->sent) lag[nlag++] = r->sent - r->intended;
        if (is_ok(r->status)) {
            ok[nok] = r->done - r->intended;
            service[nok++] = r->done - r->sent;
        } else if (is_refused(r->status)) {
            refused[nref++] = r->done - r->intended;
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
                 ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
    Counts all = count(g, INT64_MIN), win = count(g, from);
    fprintf(out, "{\n  \"protocol\": \"%s\", \"mode\": \"%s\", \"arrivals\": \"%s\", \"rate\": %.3f,\n",
            g->grpc ? "grpc" : "http1", g->closed_loop ? "closed" : "open", arrivals, g->rate);
    fprintf(out, "  \"duration_s\": %.3f, \"warmup_s\": %.3f, \"connections\": %d, \"streams\": %d,"
                 " \"timeout_s\": %.3f,\n",
            g->duration_s, g->warmup_s, g->nconns, g->grpc ? g->streams : 1, g->timeout_s);
    counts(out, "  ", all);
    fprintf(out, "  \"statuses\": ");
    statuses(out, g, INT64_MIN);
    fprintf(out, ",\n  \"connect_failures\": %llu, \"connection_resets\": %llu, \"idle_closes\": %llu,\n"
                 "  \"protocol_errors\": %llu, \"goaways\": %llu, \"stream_resets\": %llu,\n",
            (unsigned long long)g->connect_failures, (unsigned long long)g->resets,
            (unsigned long long)g->idle_closes, (unsigned long long)g->protocol_errors,
            (unsigned long long)g->goaways, (unsigned long long)g->stream_resets);
    fprintf(out, "  \"generator_cpu_s\": %.3f, \"elapsed_s\": %.3f,\n", cpu, (double)rel_now(g) / 1e9);
    fprintf(out, "  \"window\": {\n    \"seconds\": %.3f,\n", seconds);
    counts(out, "    ", win);
    fprintf(out, "    \"statuses\": ");
    statuses(out, g, from);
    fprintf(out, ",\n    \"offered_rate\": %.1f, \"achieved_rate\": %.1f, \"goodput\": %.1f,"
                 " \"refused_rate\": %.1f,\n",
            (double)win.offered / seconds, (double)win.sent / seconds, (double)win.ok / seconds,
            (double)win.refused / seconds);
    percentiles(out, "ok_latency_ms", ok, nok, true);
    percentiles(out, "ok_service_ms", service, nok, true);
    percentiles(out, "refused_latency_ms", refused, nref, true);
    percentiles(out, "send_lag_ms", lag, nlag, false);
    fprintf(out, "  }\n}\n");
    free(ok), free(refused), free(service), free(lag);
}
