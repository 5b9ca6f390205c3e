/* HTTP/1.1 keep-alive client side: one request in flight per connection, responses framed by
 * Content-Length, chunked encoding, or the server closing the connection.
 */
#include "openloop.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>


#define MAX_HEAD 65536

bool h1_has_capacity(const Gen *g, const Conn *c) {
    (void)g;
    return c->state == CS_OPEN && c->req < 0;
}

void h1_send(Gen *g, Conn *c, int64_t req) {
    c->req = req;
    c->inflight = 1;
    out_append(g, c, g->tmpl, g->tmpl_len);
}

/* Where a chunked body ends (bytes from ``body``), or 0 while incomplete, -1 when malformed. */
static long chunked_end(const uint8_t *body, size_t len) {
    size_t off = 0;
    for (;;) {
        const uint8_t *eol = memmem(body + off, len - off, "\r\n", 2);
        if (!eol) return 0;
        char *stop;
        unsigned long size = strtoul((const char *)body + off, &stop, 16);
        if (stop == (const char *)body + off) return -1;
        off = (size_t)(eol - body) + 2;
        if (size == 0) {
            /* optional trailers, then an empty line */
            for (;;) {
                const uint8_t *line = memmem(body + off, len - off, "\r\n", 2);
                if (!line) return 0;
                size_t at = off;
                off = (size_t)(line - body) + 2;
                if (line == body + at) return (long)off;
            }
        }
        if (len - off < size + 2) return 0;
        off += size + 2;
    }
}

typedef struct {
    int status;
    long length;
    bool chunked, close;
} Head;

static bool header_is(const char *line, size_t len, const char *name) {
    size_t n = strlen(name);
    return len > n && line[n] == ':' && strncasecmp(line, name, n) == 0;
}

static bool value_has(const char *line, size_t len, const char *word) {
    size_t n = strlen(word);
    for (size_t i = 0; i + n <= len; i++)
        if (strncasecmp(line + i, word, n) == 0) return true;
    return false;
}

static int parse_head(const char *p, size_t hlen, Head *h) {
    if (hlen < 12 || memcmp(p, "HTTP/1.", 7) != 0) return -1;
    h->status = atoi(p + 9);
    h->length = -1;
    h->chunked = h->close = false;
    if (p[7] == '0') h->close = true;
    const char *line = memchr(p, '\n', hlen);
    while (line && (size_t)(++line - p) < hlen) {
        const char *eol = memchr(line, '\n', hlen - (size_t)(line - p));
        if (!eol) break;
        size_t len = (size_t)(eol - line);
        if (header_is(line, len, "content-length")) h->length = atol(line + 15);
        else if (header_is(line, len, "transfer-encoding")) h->chunked = value_has(line, len, "chunked");
        else if (header_is(line, len, "connection")) {
            if (value_has(line, len, "close")) h->close = true;
            if (value_has(line, len, "keep-alive")) h->close = false;
        }
        line = eol;
    }
    return h->status >= 100 && h->status <= 999 ? 0 : -1;
}

int h1_on_data(Gen *g, Conn *c, int64_t now) {
    while (c->in_len > 0) {
        if (c->req < 0 || c->close_delimited_status) return c->req < 0 ? -1 : 0;
        const uint8_t *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
        if (!end) return c->in_len > MAX_HEAD ? -1 : 0;
        size_t hlen = (size_t)(end - c->in) + 4, total;
        Head h;
        if (parse_head((const char *)c->in, hlen, &h) < 0) return -1;
        if (h.status < 200 || h.status == 204 || h.status == 304) {
            total = hlen;
        } else if (h.chunked) {
            long body = chunked_end(c->in + hlen, c->in_len - hlen);
            if (body < 0) return -1;
            if (body == 0) return 0;
            total = hlen + (size_t)body;
        } else if (h.length >= 0) {
            total = hlen + (size_t)h.length;
            if (c->in_len < total) return 0;
        } else {
            c->close_delimited_status = h.status; /* answered when the server closes */
            return 0;
        }
        memmove(c->in, c->in + total, c->in_len - total);
        c->in_len -= total;
        if (h.status < 200) continue; /* 100 Continue and friends */
        int64_t req = c->req;
        c->req = -1;
        c->inflight = 0;
        complete(g, c, req, h.status, now);
        if (h.close) return 1;
        mark_ready(g, c);
    }
    return 0;
}
