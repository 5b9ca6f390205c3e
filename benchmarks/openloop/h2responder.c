/* h2responder: a trivial h2c gRPC server (one thread, epoll) that answers every call with the
 * same small message and grpc-status 0, to measure the generator's own gRPC ceiling. It trusts
 * its client: no HPACK decoding (request headers are skipped), no stream bookkeeping beyond
 * "DATA with END_STREAM ends a call".
 *
 *   h2responder PORT
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF (1 << 20)

typedef struct {
    int fd;
    bool preface;
    size_t len, out_len;
    uint8_t in[BUF];
    uint8_t out[BUF];
} Conn;

static void frame(Conn *c, uint32_t len, uint8_t type, uint8_t flags, uint32_t stream, const void *p) {
    if (c->out_len + 9 + len > BUF) return;
    uint8_t *h = c->out + c->out_len;
    h[0] = (uint8_t)(len >> 16), h[1] = (uint8_t)(len >> 8), h[2] = (uint8_t)len, h[3] = type, h[4] = flags;
    uint32_t s = htonl(stream);
    memcpy(h + 5, &s, 4);
    memcpy(h + 9, p, len);
    c->out_len += 9 + len;
}

/* :status 200 (static 8), content-type: application/grpc (literal, name static 31) */
static const uint8_t HEAD[] = {0x88, 0x0f, 0x10, 16, 'a', 'p', 'p', 'l', 'i', 'c', 'a', 't', 'i',
                               'o', 'n', '/', 'g', 'r', 'p', 'c'};
/* grpc-status: 0 (literal without indexing, new name) */
static const uint8_t TRAILERS[] = {0x00, 11, 'g', 'r', 'p', 'c', '-', 's', 't', 'a', 't', 'u', 's', 1, '0'};
static const uint8_t MESSAGE[] = {0, 0, 0, 0, 2, 0x0a, 0x00}; /* a 2-byte protobuf */

static int serve(Conn *c) {
    size_t off = 0;
    if (!c->preface) {
        if (c->len < 24) return 0;
        off = 24;
        c->preface = true;
        frame(c, 0, 4, 0, 0, NULL);
        uint32_t inc = htonl(0x7fffffffu - 65535);
        frame(c, 4, 8, 0, 0, &inc);
    }
    while (c->len - off >= 9) {
        uint8_t *f = c->in + off;
        uint32_t len = (uint32_t)f[0] << 16 | (uint32_t)f[1] << 8 | f[2], stream;
        if (9 + len > BUF) return -1;
        if (c->len - off < 9 + len) break;
        memcpy(&stream, f + 5, 4);
        stream = ntohl(stream) & 0x7fffffff;
        if (f[3] == 4 && !(f[4] & 1)) frame(c, 0, 4, 1, 0, NULL); /* SETTINGS ack */
        if (f[3] == 0 && (f[4] & 1)) {
            frame(c, sizeof HEAD, 1, 0x4, stream, HEAD);
            frame(c, sizeof MESSAGE, 0, 0, stream, MESSAGE);
            frame(c, sizeof TRAILERS, 1, 0x5, stream, TRAILERS);
        }
        off += 9 + len;
    }
    memmove(c->in, c->in + off, c->len - off);
    c->len -= off;
    size_t sent = 0;
    while (sent < c->out_len) {
        ssize_t n = send(c->fd, c->out + sent, c->out_len - sent, MSG_NOSIGNAL);
        if (n <= 0) return -1; /* a benchmark responder: a full socket buffer ends the connection */
        sent += (size_t)n;
    }
    c->out_len = 0;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: h2responder PORT\n");
        return 2;
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 4096) < 0) {
        perror("listen");
        return 1;
    }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL}, evs[256];
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            Conn *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, 0)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    Conn *nc = calloc(1, sizeof *nc);
                    nc->fd = fd;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
                continue;
            }
            ssize_t r = recv(c->fd, c->in + c->len, BUF - c->len, 0);
            if (r > 0) c->len += (size_t)r;
            if (r <= 0 || serve(c) < 0) {
                close(c->fd);
                free(c);
            }
        }
    }
}
