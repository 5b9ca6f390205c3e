/* openloop: shared types of the open-loop load generator (one thread, one epoll set).
 *
 * Requests have an intended send time fixed before the run; latency counts from it, so a
 * request that waits for a free connection (or stream) inside the generator is charged for the
 * wait (no coordinated omission). All times are nanoseconds since the start of the schedule.
 */
#ifndef OPENLOOP_H
#define OPENLOOP_H

#define _GNU_SOURCE
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    ST_PENDING = 0,  /* not answered yet */
    ST_TIMEOUT = -1, /* sent, no answer within the timeout (counted from the intended time) */
    ST_ERROR = -2,   /* sent, the connection or stream failed before the answer */
    ST_EXPIRED = -3, /* waited in the generator's queue past the timeout; never sent */
};

/* One request's record; the binary log is an array of these (32 bytes, little-endian). */
typedef struct {
    int64_t intended; /* ns: when the schedule says it is sent */
    int64_t sent;     /* ns: when its bytes were handed to the socket (0: never) */
    int64_t done;     /* ns: when its answer (or its failure) was seen */
    int32_t status;   /* HTTP status, 1000 + grpc-status for gRPC, or an ST_ value */
    int32_t conn;     /* connection it went on (-1: none) */
} Req;

typedef struct {
    uint32_t stream;
    int64_t req;
    int http_status;
    int grpc_status;
} Slot;

typedef struct Hpack Hpack;

enum { CS_CLOSED, CS_CONNECTING, CS_OPEN };

typedef struct {
    int id, fd, state;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    uint8_t *in;
    size_t in_len, in_cap;
    int inflight;
    bool in_ready, dirty, want_out;
    int64_t reconnect_at;
    int failed_connects;
    /* HTTP/1.1: the one request in flight */
    int64_t req;
    int close_delimited_status; /* answer without a length: complete when the server closes */
    /* HTTP/2 */
    uint32_t next_stream, peer_max_frame, peer_max_streams;
    int64_t send_window, peer_init_window;
    bool goaway;
    Slot *slots;
    Hpack *hpack;
    uint8_t *hblock;
    size_t hblock_len, hblock_cap;
    uint32_t hblock_stream;
    bool hblock_end_stream;
    uint64_t recv_unacked;
} Conn;

typedef struct {
    /* configuration */
    bool grpc, closed_loop;
    int nconns, streams;
    double rate, duration_s, warmup_s, timeout_s;
    int64_t timeout;
    uint8_t *tmpl; /* HTTP/1.1: the whole request; gRPC: the 5-byte prefix and the message */
    size_t tmpl_len;
    uint8_t *block; /* gRPC: the request's HPACK header block, encoded once */
    size_t block_len;
    /* state */
    Req *reqs;
    size_t nreq, cap, gen, disp;
    Conn *conns;
    int *ready;
    int ready_head, ready_count;
    int *dirty;
    int ndirty;
    int epfd;
    int64_t t0, inflight;
    /* counters */
    uint64_t connect_failures, resets, idle_closes, protocol_errors, goaways, stream_resets;
} Gen;

int64_t rel_now(const Gen *g);
void out_append(Gen *g, Conn *c, const void *data, size_t len);
void complete(Gen *g, Conn *c, int64_t req, int status, int64_t now);
void mark_ready(Gen *g, Conn *c);
void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);

/* http1.c */
void h1_send(Gen *g, Conn *c, int64_t req);
int h1_on_data(Gen *g, Conn *c, int64_t now); /* 0: fine, 1: close cleanly, -1: protocol error */
bool h1_has_capacity(const Gen *g, const Conn *c);

/* http2.c */
void h2_encode_block(Gen *g, const char *path, const char *authority);
void h2_on_connect(Gen *g, Conn *c);
void h2_send(Gen *g, Conn *c, int64_t req);
int h2_on_data(Gen *g, Conn *c, int64_t now);
bool h2_has_capacity(const Gen *g, const Conn *c);
void h2_expire(Gen *g, Conn *c, int64_t now);
void h2_fail_all(Gen *g, Conn *c, int64_t now);

/* hpack.c */
typedef void (*HeaderFn)(void *ctx, const char *name, size_t nlen, const char *value, size_t vlen);
Hpack *hpack_new(void);
void hpack_free(Hpack *h);
int hpack_decode(Hpack *h, const uint8_t *p, size_t len, HeaderFn fn, void *ctx);
size_t hpack_put_int(uint8_t *out, uint8_t base, int prefix, uint64_t value);

#endif
