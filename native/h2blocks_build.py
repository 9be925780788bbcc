"""cffi's API-mode build of `aggregator.web.http2._h2blocks` (native/h2blocks.c), run by setup.py.

Optional: where it does not compile (no C compiler, no Python headers) the install goes on and the
gateway collects header blocks in Python (aggregator/web/http2/nghttp2.py says which at start).
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

CDEF = """
typedef struct {
    int32_t stream;
    int too_large;
    size_t bytes;
    size_t max_list;
    int64_t room_held;
    size_t count;
    size_t used;
    size_t cap;
    char *data;
    size_t *lens;
    size_t lens_cap;
} agg_block;
void agg_block_clear(agg_block *b);
void agg_block_free(agg_block *b);
int agg_on_header(void *session, const void *hd, const uint8_t *name, size_t namelen,
                  const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "aggregator.web.http2._h2blocks",
    '#include "h2blocks.c"',
    include_dirs=[str(HERE)],
    extra_compile_args=["-O2"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
