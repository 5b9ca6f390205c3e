/* openloop: a single-threaded, coordinated-omission-free load generator for HTTP/1.1 and gRPC.
 *
 * Open loop: request i has an intended send time (uniform or Poisson arrivals) fixed before the
 * run. Due requests wait in a FIFO inside the generator until a connection (or an HTTP/2 stream)
 * is free; their latency still counts from the intended time, and the wait is recorded apart
 * as send lag. Closed loop (--rate 0): every connection sends its next request as soon as the
 * last one is answered. Writes a JSON summary and, optionally, a binary log of Req records.
 *
 *   openloop --port 8000 --request req.http --rate 20000 --duration 10 --connections 256
 *   openloop --grpc --port 8001 --path /pkg.Svc/Method --request msg.bin --rate 5000 ...
 */
#include "openloop.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>


#define SCAN_NS 5000000LL /* timeouts and reconnects are checked every 5 ms */
#define MAX_IN (2u << 20)

static struct sockaddr_in target;

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        perror("malloc");
        exit(2);
    }
    return p;
}

void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) {
        perror("realloc");
        exit(2);
    }
    return p;
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t rel_now(const Gen *g) { return mono_ns() - g->t0; }

void out_append(Gen *g, Conn *c, const void *data, size_t len) {
    if (c->out_len + len > c->out_cap) {
        c->out_cap = (c->out_len + len) * 2;
        c->out = xrealloc(c->out, c->out_cap);
    }
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
    if (!c->dirty) {
        c->dirty = true;
        g->dirty[g->ndirty++] = c->id;
    }
}

void complete(Gen *g, Conn *c, int64_t req, int status, int64_t now) {
    (void)c;
    Req *r = &g->reqs[req];
    r->status = status;
    r->done = now;
    g->inflight--;
}

static bool has_capacity(const Gen *g, const Conn *c) {
    return g->grpc ? h2_has_capacity(g, c) : h1_has_capacity(g, c);
}

void mark_ready(Gen *g, Conn *c) {
    if (c->in_ready || !has_capacity(g, c)) return;
    c->in_ready = true;
    g->ready[(g->ready_head + g->ready_count++) % g->nconns] = c->id;
}

static Conn *pop_ready(Gen *g) {
    while (g->ready_count > 0) {
        Conn *c = &g->conns[g->ready[g->ready_head]];
        g->ready_head = (g->ready_head + 1) % g->nconns;
        g->ready_count--;
        c->in_ready = false;
        if (has_capacity(g, c)) return c;
    }
    return NULL;
}

static void watch(Gen *g, Conn *c, int op, bool out) {
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.u32 = (uint32_t)c->id};
    epoll_ctl(g->epfd, op, c->fd, &ev);
    c->want_out = out;
}

static void conn_open(Gen *g, Conn *c, int64_t now) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        perror("socket");
        exit(2);
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->out_len = c->out_off = c->in_len = 0;
    c->req = -1;
    c->inflight = 0;
    c->close_delimited_status = 0;
    if (connect(c->fd, (struct sockaddr *)&target, sizeof target) < 0 && errno != EINPROGRESS) {
        g->connect_failures++;
        close(c->fd);
        c->fd = -1;
        c->reconnect_at = now + 20000000LL * (c->failed_connects < 10 ? ++c->failed_connects : 10);
        return;
    }
    c->state = CS_CONNECTING;
    watch(g, c, EPOLL_CTL_ADD, true);
}

/* Close a connection; requests still on it failed (or, for a close-delimited answer, ended). */
static void conn_close(Gen *g, Conn *c, int64_t now, bool clean) {
    if (c->state == CS_OPEN && c->inflight > 0) {
        if (!g->grpc && c->close_delimited_status) {
            complete(g, c, c->req, c->close_delimited_status, now);
        } else {
            g->resets++;
            if (g->grpc) h2_fail_all(g, c, now);
            else complete(g, c, c->req, ST_ERROR, now);
        }
    } else if (c->state == CS_OPEN && !clean) {
        g->idle_closes++;
    }
    c->req = -1;
    c->inflight = 0;
    close(c->fd);
    c->fd = -1;
    c->state = CS_CLOSED;
    c->dirty = false; /* a stale entry in g->dirty is skipped */
    c->reconnect_at = now;
}

static void conn_flush(Gen *g, Conn *c, int64_t now) {
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN) break;
            conn_close(g, c, now, false);
            return;
        }
        c->out_off += (size_t)n;
    }
    if (c->out_off == c->out_len) c->out_off = c->out_len = 0;
    bool out = c->out_len > 0;
    if (out != c->want_out) watch(g, c, EPOLL_CTL_MOD, out);
}

static void flush_dirty(Gen *g, int64_t now) {
    for (int i = 0; i < g->ndirty; i++) {
        Conn *c = &g->conns[g->dirty[i]];
        if (!c->dirty) continue;
        c->dirty = false;
        if (c->state == CS_OPEN) conn_flush(g, c, now);
    }
    g->ndirty = 0;
}

static void send_req(Gen *g, Conn *c, size_t i, int64_t now) {
    Req *r = &g->reqs[i];
    r->sent = now > 0 ? now : 1;
    r->conn = c->id;
    g->inflight++;
    if (g->grpc) h2_send(g, c, (int64_t)i);
    else h1_send(g, c, (int64_t)i);
}

static void dispatch(Gen *g, int64_t now) {
    if (g->closed_loop) {
        for (Conn *c; now < (int64_t)(g->duration_s * 1e9) && (c = pop_ready(g));) {
            if (g->nreq == g->cap) {
                g->cap *= 2;
                g->reqs = xrealloc(g->reqs, g->cap * sizeof *g->reqs);
            }
            g->reqs[g->nreq] = (Req){now, 0, 0, ST_PENDING, -1};
            send_req(g, c, g->nreq++, now);
            mark_ready(g, c);
        }
        g->gen = g->disp = g->nreq;
        return;
    }
    while (g->disp < g->gen) {
        Req *r = &g->reqs[g->disp];
        if (now - r->intended > g->timeout) {
            r->status = ST_EXPIRED;
            r->done = now;
            g->disp++;
            continue;
        }
        Conn *c = pop_ready(g);
        if (!c) break;
        send_req(g, c, g->disp++, now);
        mark_ready(g, c);
    }
}

static void scan(Gen *g, int64_t now, bool connect) {
    for (int i = 0; i < g->nconns; i++) {
        Conn *c = &g->conns[i];
        if (c->state == CS_CLOSED && connect && now >= c->reconnect_at) conn_open(g, c, now);
        if (c->state != CS_OPEN || c->inflight == 0) continue;
        if (g->grpc) {
            h2_expire(g, c, now);
            if (c->goaway && c->inflight == 0) conn_close(g, c, now, true);
        } else if (now - g->reqs[c->req].intended > g->timeout) {
            complete(g, c, c->req, ST_TIMEOUT, now);
            c->inflight = 0;
            c->req = -1;
            conn_close(g, c, now, true);
        }
    }
}

static void on_event(Gen *g, Conn *c, uint32_t events, int64_t now) {
    if (c->state == CS_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err || (events & (EPOLLERR | EPOLLHUP))) {
            g->connect_failures++;
            close(c->fd);
            c->fd = -1;
            c->state = CS_CLOSED;
            c->reconnect_at = now + 20000000LL * (c->failed_connects < 10 ? ++c->failed_connects : 10);
            return;
        }
        if (!(events & EPOLLOUT)) return;
        c->state = CS_OPEN;
        c->failed_connects = 0;
        if (g->grpc) h2_on_connect(g, c);
        watch(g, c, EPOLL_CTL_MOD, false);
        mark_ready(g, c);
        return;
    }
    if (c->state != CS_OPEN) return;
    if (events & EPOLLOUT) conn_flush(g, c, now);
    if (c->state != CS_OPEN || !(events & (EPOLLIN | EPOLLERR | EPOLLHUP))) return;
    if (c->in_len == c->in_cap) {
        if (c->in_cap >= MAX_IN) {
            g->protocol_errors++;
            conn_close(g, c, now, false);
            return;
        }
        c->in_cap *= 2;
        c->in = xrealloc(c->in, c->in_cap);
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
        conn_close(g, c, now, false);
        return;
    }
    c->in_len += (size_t)n;
    int rc = g->grpc ? h2_on_data(g, c, now) : h1_on_data(g, c, now);
    if (rc < 0) g->protocol_errors++;
    if (rc != 0) conn_close(g, c, now, rc > 0);
}

static void schedule(Gen *g, const char *arrivals, uint64_t seed) {
    if (g->closed_loop) {
        g->cap = 1 << 16;
        g->reqs = xmalloc(g->cap * sizeof *g->reqs);
        return;
    }
    bool poisson = strcmp(arrivals, "poisson") == 0;
    double mean = g->rate * g->duration_s; /* Poisson: room for 10 standard deviations more */
    size_t n = (size_t)(mean + (poisson ? 10 * sqrt(mean) + 10 : 0));
    g->reqs = xmalloc((n + 1) * sizeof *g->reqs);
    double t = 0;
    uint64_t x = seed * 2654435761u + 88172645463325252ULL;
    for (size_t i = 0; i < n; i++) {
        if (poisson) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            t += -log(((double)(x >> 11) + 0.5) / 9007199254740992.0) / g->rate;
        } else {
            t = (double)i / g->rate;
        }
        if (t >= g->duration_s) break;
        g->reqs[g->nreq++] = (Req){(int64_t)(t * 1e9), 0, 0, ST_PENDING, -1};
    }
}

/* Open every connection before the clock starts (up to 5 s); the schedule begins afterwards. */
static void warm_up_connections(Gen *g) {
    g->t0 = mono_ns();
    for (int i = 0; i < g->nconns; i++) conn_open(g, &g->conns[i], 0);
    struct epoll_event evs[256];
    for (int64_t end = rel_now(g) + 5000000000LL; rel_now(g) < end;) {
        int open = 0;
        for (int i = 0; i < g->nconns; i++) open += g->conns[i].state == CS_OPEN;
        if (open == g->nconns) break;
        int n = epoll_wait(g->epfd, evs, 256, 10);
        for (int i = 0; i < n; i++) on_event(g, &g->conns[evs[i].data.u32], evs[i].events, 0);
        flush_dirty(g, 0);
        scan(g, rel_now(g), true);
    }
}

static void run(Gen *g) {
    struct epoll_event evs[512];
    warm_up_connections(g);
    g->t0 = mono_ns();
    int64_t duration = (int64_t)(g->duration_s * 1e9), next_scan = 0;
    for (;;) {
        int64_t now = rel_now(g);
        while (g->gen < g->nreq && g->reqs[g->gen].intended <= now) g->gen++;
        dispatch(g, now);
        flush_dirty(g, now);
        if (now >= next_scan) {
            scan(g, now, true);
            flush_dirty(g, now);
            next_scan = now + SCAN_NS;
        }
        bool issued = g->closed_loop ? now >= duration : g->disp == g->nreq;
        if (issued && g->inflight == 0) break;
        int64_t wake = next_scan;
        if (g->gen < g->nreq && g->reqs[g->gen].intended < wake) wake = g->reqs[g->gen].intended;
        if (g->closed_loop && now < duration && duration < wake) wake = duration;
        int64_t wait = wake > now ? wake - now : 0;
        struct timespec ts = {wait / 1000000000LL, wait % 1000000000LL};
        int n = epoll_pwait2(g->epfd, evs, 512, &ts, NULL);
        now = rel_now(g);
        for (int i = 0; i < n; i++) on_event(g, &g->conns[evs[i].data.u32], evs[i].events, now);
    }
}

void write_summary(const Gen *g, FILE *out, const char *arrivals); /* summary.c */

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = xmalloc((size_t)n + 5);
    if (fread(data, 1, (size_t)n, f) != (size_t)n) {
        perror(path);
        exit(2);
    }
    fclose(f);
    *len = (size_t)n;
    return data;
}

static void usage(void) {
    fprintf(stderr,
            "usage: openloop --port P --request FILE [--host 127.0.0.1] [--rate R (0: closed loop)]\n"
            "  [--duration S] [--warmup S] [--connections N] [--arrivals uniform|poisson] [--seed N]\n"
            "  [--timeout S] [--grpc --path /svc/Method [--streams N]] [--log FILE] [--summary FILE]\n");
    exit(2);
}

int main(int argc, char **argv) {
    Gen g = {.nconns = 64, .streams = 100, .rate = 1000, .duration_s = 5, .timeout_s = 5};
    const char *host = "127.0.0.1", *request = NULL, *path = NULL, *log_path = NULL;
    const char *summary = NULL, *arrivals = "uniform";
    int port = 0;
    uint64_t seed = 1;
    static const struct option opts[] = {
        {"host", 1, 0, 'H'},    {"port", 1, 0, 'p'},     {"request", 1, 0, 'q'}, {"rate", 1, 0, 'r'},
        {"duration", 1, 0, 'd'}, {"warmup", 1, 0, 'w'},  {"connections", 1, 0, 'c'},
        {"arrivals", 1, 0, 'a'}, {"seed", 1, 0, 's'},    {"timeout", 1, 0, 't'}, {"grpc", 0, 0, 'g'},
        {"path", 1, 0, 'P'},     {"streams", 1, 0, 'm'}, {"log", 1, 0, 'l'},     {"summary", 1, 0, 'o'},
        {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (o) {
        case 'H': host = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 'q': request = optarg; break;
        case 'r': g.rate = atof(optarg); break;
        case 'd': g.duration_s = atof(optarg); break;
        case 'w': g.warmup_s = atof(optarg); break;
        case 'c': g.nconns = atoi(optarg); break;
        case 'a': arrivals = optarg; break;
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 't': g.timeout_s = atof(optarg); break;
        case 'g': g.grpc = true; break;
        case 'P': path = optarg; break;
        case 'm': g.streams = atoi(optarg); break;
        case 'l': log_path = optarg; break;
        case 'o': summary = optarg; break;
        default: usage();
        }
    }
    if (!port || !request || g.nconns < 1 || g.streams < 1 || g.duration_s <= 0 || g.rate < 0 ||
        (g.grpc && !path) || (strcmp(arrivals, "uniform") && strcmp(arrivals, "poisson")))
        usage();
    target.sin_family = AF_INET;
    target.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &target.sin_addr) != 1) {
        fprintf(stderr, "openloop: --host must be an IPv4 address: %s\n", host);
        return 2;
    }
    prctl(PR_SET_TIMERSLACK, 1000UL);
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max; /* thousands of connections */
        setrlimit(RLIMIT_NOFILE, &files);
    }
    g.closed_loop = g.rate == 0;
    g.timeout = (int64_t)(g.timeout_s * 1e9);
    size_t raw_len;
    uint8_t *raw = read_file(request, &raw_len);
    if (g.grpc) {
        g.tmpl = xmalloc(raw_len + 5);
        g.tmpl[0] = 0;
        uint32_t be = htonl((uint32_t)raw_len);
        memcpy(g.tmpl + 1, &be, 4);
        memcpy(g.tmpl + 5, raw, raw_len);
        g.tmpl_len = raw_len + 5;
        char authority[64];
        snprintf(authority, sizeof authority, "%s:%d", host, port);
        h2_encode_block(&g, path, authority);
    } else {
        g.tmpl = raw;
        g.tmpl_len = raw_len;
    }
    schedule(&g, arrivals, seed);
    g.epfd = epoll_create1(EPOLL_CLOEXEC);
    g.conns = calloc((size_t)g.nconns, sizeof *g.conns);
    g.ready = xmalloc((size_t)g.nconns * sizeof(int));
    g.dirty = xmalloc((size_t)g.nconns * sizeof(int));
    for (int i = 0; i < g.nconns; i++) {
        Conn *c = &g.conns[i];
        c->id = i;
        c->fd = -1;
        c->req = -1;
        c->in_cap = 65536;
        c->in = xmalloc(c->in_cap);
        if (g.grpc) c->slots = xmalloc((size_t)g.streams * sizeof(Slot));
    }
    run(&g);
    if (log_path) {
        FILE *f = fopen(log_path, "wb");
        if (!f || fwrite(g.reqs, sizeof(Req), g.nreq, f) != g.nreq) perror(log_path);
        if (f) fclose(f);
    }
    FILE *out = summary ? fopen(summary, "w") : stdout;
    if (!out) {
        perror(summary);
        return 2;
    }
    write_summary(&g, out, arrivals);
    fclose(out);
    return 0;
}
