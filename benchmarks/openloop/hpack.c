/* HPACK (RFC 7541) decoding for the gRPC client: static and dynamic tables, Huffman strings.
 *
 * The server's encoder may index and Huffman-code anything, so a faithful decoder is the only
 * way to read ``:status`` and ``grpc-status`` reliably. The encoder side is one integer helper:
 * the request's header block uses literals without indexing and is built once.
 */
#include "openloop.h"

#include <stdlib.h>
#include <string.h>

#include "hpack_tables.h"

#define NAME_MAX_LEN 4096
#define VALUE_MAX_LEN 65536
#define TABLE_MAX 4096 /* SETTINGS_HEADER_TABLE_SIZE: we keep the default */

typedef struct {
    char *data; /* name then value */
    size_t nlen, vlen;
} Entry;

struct Hpack {
    Entry *entries; /* newest first */
    size_t count, cap, size, max;
    char name[NAME_MAX_LEN];
    char value[VALUE_MAX_LEN];
};

static int16_t tree[513][2];
static int16_t leaf[513];
static int tree_nodes;

static void build_tree(void) {
    tree_nodes = 1;
    memset(tree, 0, sizeof tree);
    for (int i = 0; i < 513; i++) leaf[i] = -1;
    for (int sym = 0; sym < 257; sym++) {
        int node = 0;
        for (int bit = HUFFMAN_BITS[sym] - 1; bit >= 0; bit--) {
            int b = (HUFFMAN_CODE[sym] >> bit) & 1;
            if (tree[node][b] == 0) tree[node][b] = (int16_t)tree_nodes++;
            node = tree[node][b];
        }
        leaf[node] = (int16_t)sym;
    }
}

Hpack *hpack_new(void) {
    if (tree_nodes == 0) build_tree();
    Hpack *h = xmalloc(sizeof *h);
    memset(h, 0, sizeof *h - sizeof h->name - sizeof h->value);
    h->max = TABLE_MAX;
    return h;
}

void hpack_free(Hpack *h) {
    if (!h) return;
    for (size_t i = 0; i < h->count; i++) free(h->entries[i].data);
    free(h->entries);
    free(h);
}

static void evict_to(Hpack *h, size_t limit) {
    while (h->count > 0 && h->size > limit) {
        Entry *e = &h->entries[--h->count];
        h->size -= e->nlen + e->vlen + 32;
        free(e->data);
    }
}

static void insert(Hpack *h, const char *n, size_t nlen, const char *v, size_t vlen) {
    size_t need = nlen + vlen + 32;
    if (need > h->max) {
        evict_to(h, 0);
        return;
    }
    evict_to(h, h->max - need);
    if (h->count == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 16;
        h->entries = xrealloc(h->entries, h->cap * sizeof *h->entries);
    }
    memmove(h->entries + 1, h->entries, h->count * sizeof *h->entries);
    char *data = xmalloc(nlen + vlen + 1);
    memcpy(data, n, nlen);
    memcpy(data + nlen, v, vlen);
    h->entries[0] = (Entry){data, nlen, vlen};
    h->count++;
    h->size += need;
}

/* The entry at ``index`` (1-based over the static then the dynamic table). */
static int lookup(const Hpack *h, uint64_t index, const char **n, size_t *nlen, const char **v,
                  size_t *vlen) {
    if (index >= 1 && index <= 61) {
        *n = HPACK_STATIC[index - 1][0];
        *v = HPACK_STATIC[index - 1][1];
        *nlen = strlen(*n);
        *vlen = strlen(*v);
        return 0;
    }
    if (index < 62 || index - 62 >= h->count) return -1;
    const Entry *e = &h->entries[index - 62];
    *n = e->data;
    *nlen = e->nlen;
    *v = e->data + e->nlen;
    *vlen = e->vlen;
    return 0;
}

static int get_int(const uint8_t **p, const uint8_t *end, int prefix, uint64_t *out) {
    if (*p >= end) return -1;
    uint64_t mask = (1u << prefix) - 1, v = **p & mask;
    (*p)++;
    if (v < mask) {
        *out = v;
        return 0;
    }
    for (int shift = 0; *p < end && shift <= 28; shift += 7) {
        uint8_t b = *(*p)++;
        v += (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

static int huffman(const uint8_t *p, size_t len, char *out, size_t cap, size_t *outlen) {
    size_t n = 0;
    int node = 0;
    for (size_t i = 0; i < len; i++) {
        for (int bit = 7; bit >= 0; bit--) {
            node = tree[node][(p[i] >> bit) & 1];
            if (node == 0) return -1;
            if (leaf[node] >= 0) {
                if (leaf[node] == 256 || n == cap) return -1;
                out[n++] = (char)leaf[node];
                node = 0;
            }
        }
    }
    *outlen = n;
    return 0;
}

static int get_str(const uint8_t **p, const uint8_t *end, char *out, size_t cap, size_t *outlen) {
    if (*p >= end) return -1;
    bool huff = **p & 0x80;
    uint64_t len;
    if (get_int(p, end, 7, &len) < 0 || len > (uint64_t)(end - *p)) return -1;
    if (huff) {
        if (huffman(*p, len, out, cap, outlen) < 0) return -1;
    } else {
        if (len > cap) return -1;
        memcpy(out, *p, len);
        *outlen = len;
    }
    *p += len;
    return 0;
}

/* A literal field: name by index (or a literal name when the index is 0), literal value. */
static int literal(Hpack *h, const uint8_t **p, const uint8_t *end, int prefix, bool index_it,
                   HeaderFn fn, void *ctx) {
    uint64_t index;
    size_t nlen, vlen;
    if (get_int(p, end, prefix, &index) < 0) return -1;
    if (index == 0) {
        if (get_str(p, end, h->name, sizeof h->name, &nlen) < 0) return -1;
    } else {
        const char *n, *v;
        size_t unused;
        if (lookup(h, index, &n, &nlen, &v, &unused) < 0 || nlen > sizeof h->name) return -1;
        memcpy(h->name, n, nlen);
    }
    if (get_str(p, end, h->value, sizeof h->value, &vlen) < 0) return -1;
    fn(ctx, h->name, nlen, h->value, vlen);
    if (index_it) insert(h, h->name, nlen, h->value, vlen);
    return 0;
}

int hpack_decode(Hpack *h, const uint8_t *p, size_t len, HeaderFn fn, void *ctx) {
    const uint8_t *end = p + len;
    while (p < end) {
        uint8_t b = *p;
        if (b & 0x80) {
            uint64_t index;
            const char *n, *v;
            size_t nlen, vlen;
            if (get_int(&p, end, 7, &index) < 0 || lookup(h, index, &n, &nlen, &v, &vlen) < 0)
                return -1;
            fn(ctx, n, nlen, v, vlen);
        } else if (b & 0x40) {
            if (literal(h, &p, end, 6, true, fn, ctx) < 0) return -1;
        } else if (b & 0x20) {
            uint64_t size;
            if (get_int(&p, end, 5, &size) < 0 || size > TABLE_MAX) return -1;
            h->max = size;
            evict_to(h, size);
        } else if (literal(h, &p, end, 4, false, fn, ctx) < 0) {
            return -1;
        }
    }
    return 0;
}

size_t hpack_put_int(uint8_t *out, uint8_t base, int prefix, uint64_t value) {
    uint64_t mask = (1u << prefix) - 1;
    if (value < mask) {
        out[0] = base | (uint8_t)value;
        return 1;
    }
    size_t n = 0;
    out[n++] = base | (uint8_t)mask;
    value -= mask;
    while (value >= 128) {
        out[n++] = (uint8_t)(value & 0x7f) | 0x80;
        value >>= 7;
    }
    out[n++] = (uint8_t)value;
    return n;
}
