/* responder: a trivial HTTP/1.1 server (one thread, epoll) that answers every request with the
 * same small 200, to measure the load generator's own ceiling. Requests are framed by their
 * Content-Length; anything else about them is ignored.
 *
 *   responder PORT
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF 65536

static const char ANSWER[] = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             "content-length: 2\r\n\r\n{}";

typedef struct {
    char in[BUF];
    size_t len;
} Conn;

/* Answer every complete request in the buffer; -1 when the client misbehaves. */
static int serve(int fd, Conn *c) {
    for (;;) {
        char *end = memmem(c->in, c->len, "\r\n\r\n", 4);
        if (!end) return c->len == BUF ? -1 : 0;
        size_t head = (size_t)(end - c->in) + 4, body = 0;
        for (char *line = c->in; line < end; line = strstr(line, "\r\n") + 2)
            if (strncasecmp(line, "content-length:", 15) == 0) body = strtoul(line + 15, NULL, 10);
        if (head + body > BUF) return -1;
        if (c->len < head + body) return 0;
        if (send(fd, ANSWER, sizeof ANSWER - 1, MSG_NOSIGNAL) < 0) return -1;
        memmove(c->in, c->in + head + body, c->len - head - body);
        c->len -= head + body;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: responder PORT\n");
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
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    Conn *nc = calloc(1, sizeof *nc + sizeof(int));
                    memcpy(nc + 1, &fd, sizeof fd);
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
                continue;
            }
            int fd;
            memcpy(&fd, c + 1, sizeof fd);
            ssize_t r = recv(fd, c->in + c->len, BUF - c->len, 0);
            if (r > 0) c->len += (size_t)r;
            if (r <= 0 || serve(fd, c) < 0) {
                close(fd);
                free(c);
            }
        }
    }
}
