/* The HTTP/2 request header block, collected in C (aggregator/web/http2/nghttp2.py).
 *
 * libnghttp2 calls its header callback once per decoded field. Through cffi's ABI mode each call is
 * a libffi closure, a GIL round trip and a Python frame: about 9k instructions a field, most of what
 * an HTTP/2 request costs beyond an HTTP/1.1 one. Here the callback is C: it bounds the block as it
 * is decoded, exactly as the Python collector does (RFC 9113 6.5.2's accounting, 32 bytes a field;
 * the stream's limit and what the connection's limit leaves), and appends the field to a buffer
 * that Python takes once, whole, when the HEADERS frame completes.
 *
 * No libnghttp2 header is needed: the callback reads only the frame header, the first member of
 * `nghttp2_frame` (the layout the ABI-mode binding declares too, stable since libnghttp2 1.0), so
 * the module builds with a C compiler and Python's headers alone and never links the library.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* nghttp2_frame_hd */
typedef struct {
    size_t length;
    int32_t stream_id;
    uint8_t type;
    uint8_t flags;
    uint8_t reserved;
} agg_frame_hd;

/* Python reads what a block ends with through this structure: see nghttp2.py's `HeaderBlocks`. */
typedef struct {
    int32_t stream;      /* the stream whose block is being collected; 0 between blocks */
    int too_large;       /* past its limit: answered 431 once complete, fields dropped */
    size_t bytes;        /* the block's size so far, RFC 9113 6.5.2's accounting */
    size_t max_list;     /* one header list's limit (max_header_list_size) */
    int64_t room_held;   /* what the connection's limit leaves (max_header_bytes_held - held) */
    size_t count;        /* fields collected */
    size_t used;         /* bytes in `data`: each field's name, NUL, value, NUL */
    size_t cap;
    char *data;
    size_t *lens;        /* name length, value length, per field */
    size_t lens_cap;
} agg_block;

/* Past this, a buffer is given back once its block is taken (memory stays bounded per idle
 * connection by this, not by the largest block it ever saw). */
#define AGG_KEEP 16384

static int64_t agg_room(const agg_block *b)
{
    int64_t list = (int64_t)b->max_list;
    return b->room_held < list ? b->room_held : list;
}

void agg_block_clear(agg_block *b)
{
    b->stream = 0;
    b->too_large = 0;
    b->bytes = 0;
    b->count = 0;
    b->used = 0;
    if (b->cap > AGG_KEEP) {
        free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
    if (b->lens_cap > AGG_KEEP / sizeof(size_t)) {
        free(b->lens);
        b->lens = NULL;
        b->lens_cap = 0;
    }
}

void agg_block_free(agg_block *b)
{
    free(b->data);
    free(b->lens);
    b->data = NULL;
    b->lens = NULL;
    b->cap = b->lens_cap = b->used = b->count = 0;
}

static int agg_grow(agg_block *b, size_t more)
{
    if (b->used + more > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->used + more)
            cap *= 2;
        char *data = realloc(b->data, cap);
        if (data == NULL)
            return -1;
        b->data = data;
        b->cap = cap;
    }
    if (2 * b->count + 2 > b->lens_cap) {
        size_t cap = b->lens_cap ? 2 * b->lens_cap : 32;
        size_t *lens = realloc(b->lens, cap * sizeof(size_t));
        if (lens == NULL)
            return -1;
        b->lens = lens;
        b->lens_cap = cap;
    }
    return 0;
}

/* nghttp2_on_header_callback; `user_data` is the session's agg_block. */
int agg_on_header(void *session, const agg_frame_hd *hd, const uint8_t *name, size_t namelen,
                  const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data)
{
    agg_block *b = user_data;
    (void)session;
    (void)flags;
    if (hd->stream_id != b->stream) {
        /* A new block. One left unfinished was refused by libnghttp2 midway (its stream is
         * reset, no HEADERS frame completes it): its fields go. */
        agg_block_clear(b);
        b->stream = hd->stream_id;
    }
    if (b->too_large)
        return 0;
    size_t size = b->bytes + namelen + valuelen + 32;
    if ((int64_t)size > agg_room(b)) {
        b->too_large = 1;
        b->count = 0;
        b->used = 0;
        b->bytes = 0;
        return 0;
    }
    if (agg_grow(b, namelen + valuelen + 2) != 0)
        return -902; /* NGHTTP2_ERR_CALLBACK_FAILURE: the session ends */
    b->bytes = size;
    char *at = b->data + b->used;
    memcpy(at, name, namelen);
    at[namelen] = 0;
    memcpy(at + namelen + 1, value, valuelen);
    at[namelen + 1 + valuelen] = 0;
    b->used += namelen + valuelen + 2;
    b->lens[2 * b->count] = namelen;
    b->lens[2 * b->count + 1] = valuelen;
    b->count += 1;
    return 0;
}
