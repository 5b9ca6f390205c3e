/* HTTP/2 cleartext (prior knowledge) client for unary gRPC calls.
 *
 * Each request is one HEADERS frame (a header block encoded once, literals without indexing, so
 * the server's decoder table never changes) and DATA frames carrying the length-prefixed
 * message. Answers are read to the trailers: the call's outcome is ``grpc-status`` (recorded as
 * 1000 + code), or the HTTP ``:status`` when there is none. Flow control: the client opens its
 * receive windows wide and honours the server's connection window for what it sends.
 */
#include "openloop.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>


#define MAX_WINDOW 0x7fffffffLL
#define MAX_FRAME_IN (1u << 20)

enum { DATA = 0, HEADERS = 1, RST_STREAM = 3, SETTINGS = 4, PING = 6, GOAWAY = 7, WINDOW_UPDATE = 8,
       CONTINUATION = 9 };
enum { END_STREAM = 0x1, ACK = 0x1, END_HEADERS = 0x4, PADDED = 0x8, PRIORITY = 0x20 };

static void frame(Gen *g, Conn *c, uint32_t len, uint8_t type, uint8_t flags, uint32_t stream,
                  const void *payload) {
    uint8_t h[9] = {(uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len, type, flags};
    uint32_t s = htonl(stream);
    memcpy(h + 5, &s, 4);
    out_append(g, c, h, 9);
    if (len) out_append(g, c, payload, len);
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static size_t put_str(uint8_t *out, const char *s) {
    size_t len = strlen(s), n = hpack_put_int(out, 0, 7, len);
    memcpy(out + n, s, len);
    return n + len;
}

void h2_encode_block(Gen *g, const char *path, const char *authority) {
    uint8_t *b = xmalloc(strlen(path) + strlen(authority) + 128);
    size_t n = 0;
    b[n++] = 0x83; /* :method POST (static 3) */
    b[n++] = 0x86; /* :scheme http (static 6) */
    n += hpack_put_int(b + n, 0x00, 4, 4); /* :path, literal without indexing */
    n += put_str(b + n, path);
    n += hpack_put_int(b + n, 0x00, 4, 1); /* :authority */
    n += put_str(b + n, authority);
    n += hpack_put_int(b + n, 0x00, 4, 31); /* content-type */
    n += put_str(b + n, "application/grpc");
    b[n++] = 0x00; /* te: trailers, new name */
    n += put_str(b + n, "te");
    n += put_str(b + n, "trailers");
    g->block = b;
    g->block_len = n;
}

void h2_on_connect(Gen *g, Conn *c) {
    c->next_stream = 1;
    c->send_window = c->peer_init_window = 65535;
    c->peer_max_frame = 16384;
    c->peer_max_streams = 0xffffffffu;
    c->goaway = false;
    c->recv_unacked = 0;
    c->hblock_len = 0;
    hpack_free(c->hpack);
    c->hpack = hpack_new();
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    out_append(g, c, preface, sizeof preface - 1);
    uint8_t settings[12] = {0, 2, 0, 0, 0, 0, /* ENABLE_PUSH 0 */
                            0, 4, 0x7f, 0xff, 0xff, 0xff /* INITIAL_WINDOW_SIZE max */};
    frame(g, c, sizeof settings, SETTINGS, 0, 0, settings);
    uint32_t inc = htonl((uint32_t)(MAX_WINDOW - 65535));
    frame(g, c, 4, WINDOW_UPDATE, 0, 0, &inc);
}

bool h2_has_capacity(const Gen *g, const Conn *c) {
    uint32_t limit = (uint32_t)g->streams < c->peer_max_streams ? (uint32_t)g->streams : c->peer_max_streams;
    return c->state == CS_OPEN && !c->goaway && (uint32_t)c->inflight < limit &&
           c->send_window >= (int64_t)g->tmpl_len && c->peer_init_window >= (int64_t)g->tmpl_len &&
           c->next_stream < 0x7ffffff0u;
}

void h2_send(Gen *g, Conn *c, int64_t req) {
    uint32_t stream = c->next_stream;
    c->next_stream += 2;
    frame(g, c, (uint32_t)g->block_len, HEADERS, END_HEADERS, stream, g->block);
    for (size_t off = 0; off < g->tmpl_len;) {
        size_t n = g->tmpl_len - off < c->peer_max_frame ? g->tmpl_len - off : c->peer_max_frame;
        frame(g, c, (uint32_t)n, DATA, off + n == g->tmpl_len ? END_STREAM : 0, stream, g->tmpl + off);
        off += n;
    }
    c->send_window -= (int64_t)g->tmpl_len;
    c->slots[c->inflight++] = (Slot){stream, req, 0, -1};
}

static Slot *find(Conn *c, uint32_t stream) {
    for (int i = 0; i < c->inflight; i++)
        if (c->slots[i].stream == stream) return &c->slots[i];
    return NULL;
}

static void finish(Gen *g, Conn *c, Slot *s, int status, int64_t now) {
    int64_t req = s->req;
    *s = c->slots[--c->inflight];
    complete(g, c, req, status, now);
    mark_ready(g, c);
}

static void finish_stream(Gen *g, Conn *c, Slot *s, int64_t now) {
    int status = s->grpc_status >= 0 ? 1000 + s->grpc_status
                 : s->http_status > 0 && s->http_status != 200 ? s->http_status
                                                                : ST_ERROR;
    finish(g, c, s, status, now);
}

void h2_expire(Gen *g, Conn *c, int64_t now) {
    for (int i = 0; i < c->inflight;) {
        Slot *s = &c->slots[i];
        if (now - g->reqs[s->req].intended <= g->timeout) {
            i++;
            continue;
        }
        uint32_t cancel = htonl(0x8);
        frame(g, c, 4, RST_STREAM, 0, s->stream, &cancel);
        finish(g, c, s, ST_TIMEOUT, now);
    }
}

void h2_fail_all(Gen *g, Conn *c, int64_t now) {
    while (c->inflight > 0) finish(g, c, &c->slots[c->inflight - 1], ST_ERROR, now);
}

static void on_header(void *ctx, const char *name, size_t nlen, const char *value, size_t vlen) {
    Slot *s = ctx;
    char digits[16];
    size_t n = vlen < sizeof digits - 1 ? vlen : sizeof digits - 1;
    memcpy(digits, value, n);
    digits[n] = 0;
    if (nlen == 7 && memcmp(name, ":status", 7) == 0) s->http_status = atoi(digits);
    else if (nlen == 11 && memcmp(name, "grpc-status", 11) == 0) s->grpc_status = atoi(digits);
}

/* A complete header block: always decoded (the table must stay in step), then applied. */
static int header_block(Gen *g, Conn *c, uint32_t stream, const uint8_t *p, size_t len, bool end,
                        int64_t now) {
    Slot scratch = {0, -1, 0, -1}, *s = find(c, stream);
    if (hpack_decode(c->hpack, p, len, on_header, s ? s : &scratch) < 0) return -1;
    if (s && end) finish_stream(g, c, s, now);
    return 0;
}

/* Strip padding and priority fields; -1 when the frame is malformed. */
static int body(const uint8_t **p, uint32_t *len, uint8_t flags, bool headers) {
    uint32_t pad = 0;
    if (flags & PADDED) {
        if (*len < 1) return -1;
        pad = (*p)[0];
        (*p)++, (*len)--;
    }
    if (headers && (flags & PRIORITY)) {
        if (*len < 5) return -1;
        *p += 5, *len -= 5;
    }
    if (pad > *len) return -1;
    *len -= pad;
    return 0;
}

static int on_frame(Gen *g, Conn *c, uint8_t type, uint8_t flags, uint32_t stream,
                    const uint8_t *p, uint32_t len, int64_t now) {
    if (c->hblock_len && type != CONTINUATION) return -1;
    switch (type) {
    case DATA: {
        c->recv_unacked += len;
        if (c->recv_unacked > (1u << 30)) {
            uint32_t inc = htonl((uint32_t)c->recv_unacked);
            frame(g, c, 4, WINDOW_UPDATE, 0, 0, &inc);
            c->recv_unacked = 0;
        }
        if (body(&p, &len, flags, false) < 0) return -1;
        Slot *s = find(c, stream);
        if (s && (flags & END_STREAM)) finish_stream(g, c, s, now);
        return 0;
    }
    case HEADERS:
    case CONTINUATION:
        if (type == HEADERS) {
            if (body(&p, &len, flags, true) < 0) return -1;
            c->hblock_stream = stream;
            c->hblock_end_stream = flags & END_STREAM;
        } else if (!c->hblock_len || stream != c->hblock_stream) {
            return -1;
        }
        if ((flags & END_HEADERS) && !c->hblock_len)
            return header_block(g, c, stream, p, len, c->hblock_end_stream, now);
        if (c->hblock_len + len > c->hblock_cap) {
            c->hblock_cap = (c->hblock_len + len) * 2;
            c->hblock = xrealloc(c->hblock, c->hblock_cap);
        }
        memcpy(c->hblock + c->hblock_len, p, len);
        c->hblock_len += len;
        if (!(flags & END_HEADERS)) return 0;
        size_t n = c->hblock_len;
        c->hblock_len = 0;
        return header_block(g, c, stream, c->hblock, n, c->hblock_end_stream, now);
    case RST_STREAM: {
        Slot *s = find(c, stream);
        if (s) {
            g->stream_resets++;
            finish(g, c, s, ST_ERROR, now);
        }
        return 0;
    }
    case SETTINGS:
        if (flags & ACK) return 0;
        if (len % 6) return -1;
        for (uint32_t i = 0; i < len; i += 6) {
            uint16_t id = (uint16_t)(p[i] << 8 | p[i + 1]);
            uint32_t v = be32(p + i + 2);
            if (id == 3) c->peer_max_streams = v;
            else if (id == 4) c->peer_init_window = v;
            else if (id == 5) c->peer_max_frame = v;
        }
        frame(g, c, 0, SETTINGS, ACK, 0, NULL);
        mark_ready(g, c);
        return 0;
    case PING:
        if (len != 8) return -1;
        if (!(flags & ACK)) frame(g, c, 8, PING, ACK, 0, p);
        return 0;
    case GOAWAY: {
        if (len < 8) return -1;
        uint32_t last = be32(p) & 0x7fffffff;
        c->goaway = true;
        g->goaways++;
        for (int i = 0; i < c->inflight;) {
            if (c->slots[i].stream > last) finish(g, c, &c->slots[i], ST_ERROR, now);
            else i++;
        }
        return 0;
    }
    case WINDOW_UPDATE:
        if (len != 4) return -1;
        if (stream == 0) {
            c->send_window += be32(p) & 0x7fffffff;
            mark_ready(g, c);
        }
        return 0;
    default:
        return 0;
    }
}

int h2_on_data(Gen *g, Conn *c, int64_t now) {
    size_t off = 0;
    while (c->in_len - off >= 9) {
        const uint8_t *f = c->in + off;
        uint32_t len = (uint32_t)f[0] << 16 | (uint32_t)f[1] << 8 | f[2];
        if (len > MAX_FRAME_IN) return -1;
        if (c->in_len - off < 9 + (size_t)len) break;
        if (on_frame(g, c, f[3], f[4], be32(f + 5) & 0x7fffffff, f + 9, len, now) < 0) return -1;
        off += 9 + (size_t)len;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    return c->goaway && c->inflight == 0 ? 1 : 0;
}
