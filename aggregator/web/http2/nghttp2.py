"""libnghttp2, the HTTP/2 implementation of curl, Apache httpd and Node.js, bound through cffi.

Why native code. The pure-Python `h2` library made an HTTP/2 request cost 1.3-1.95x the CPU of an
HTTP/1.1 one (aiohttp's HTTP/1.1 parser is C): in a codec-only measurement (a kubectl GET and an
820-byte answer, `benchmarks/http2_codec.py`) h2 took 122 us per exchange, h2 with its validation
and normalization switched off 87 us, libnghttp2 through this binding 22-34 us. libnghttp2 does the
frames, HPACK, the stream state machine, flow control and RFC 9113's header validation in C; the
gateway keeps the TLS layer (the client's verified certificate chain stays with authentication), the
scheduling of handlers, and its own frame guard in front (`guard.py`).

How it is bound. cffi's ABI mode (`ffi.dlopen`): no compiler and no headers at install time, only
the shared library Debian and Ubuntu ship as `libnghttp2-14` (curl depends on it; the image
installs it). The declarations below are the subset of `nghttp2.h` the server uses, with the
structures' exact layouts. The callbacks that only read a frame's header declare their
`const nghttp2_frame *` as `const nghttp2_frame_hd *` (the union's first member: the same
address), so reading the stream id is one attribute, not two: every header of every request
crosses here. Each session's callbacks are its receiver's bound methods (`SessionEvents`), made
with the session (about 20 us, once per connection): a callback is then one Python frame, where
callbacks shared by every session would need an adapter's frame to find the session being driven.

The header callback, compiled where it could be. libnghttp2 calls back once per decoded header,
and through the ABI mode each call is a libffi closure, a GIL round trip and a Python frame (about
9k instructions a header, most of what an HTTP/2 request cost beyond an HTTP/1.1 one). Where the
install compiled `_h2blocks` (native/h2blocks.c, cffi's API mode, built by setup.py when a C
compiler and Python's headers are there) the header callback is C: it bounds and collects the
block, and Python takes it whole when the HEADERS frame completes (`HeaderBlocks`). Otherwise, or
with `AGGREGATOR_HTTP2_COMPILED=0`, the callback is the connection's `on_header`, in Python, with
the same limits. `load` says which.

Where the library is missing or too old, `load` returns None with the reason, and the server
offers only HTTP/1.1 (clients fall back to it as they do for any server without `h2`).
"""

from __future__ import annotations

import ctypes.util
import importlib
import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

# The oldest release whose API and HTTP semantics this binding was written against (Debian 12's).
MINIMUM_VERSION = (1, 43, 0)
# Where the library is looked for when `AGGREGATOR_LIBNGHTTP2` does not name it.
LIBRARY_NAMES = ("libnghttp2.so.14", "libnghttp2.14.dylib")
LIBRARY_ENV = "AGGREGATOR_LIBNGHTTP2"
# "0": header blocks collected in Python even where the compiled callback is installed.
COMPILED_ENV = "AGGREGATOR_HTTP2_COMPILED"
COMPILED_MODULE = "aggregator.web.http2._h2blocks"

CDEF = """
typedef struct nghttp2_session nghttp2_session;
typedef struct nghttp2_session_callbacks nghttp2_session_callbacks;
typedef struct nghttp2_option nghttp2_option;
typedef struct { int age; int version_num; const char *version_str; const char *proto_str; } nghttp2_info;
typedef struct { uint8_t *name; uint8_t *value; size_t namelen; size_t valuelen; uint8_t flags; } nghttp2_nv;
typedef struct { size_t length; int32_t stream_id; uint8_t type; uint8_t flags; uint8_t reserved; } nghttp2_frame_hd;
typedef union { int fd; void *ptr; } nghttp2_data_source;
typedef ssize_t (*nghttp2_data_source_read_callback)(uintptr_t session, int32_t stream_id,
    uint8_t *buf, size_t length, uint32_t *data_flags, uintptr_t source, uintptr_t user_data);
typedef struct { nghttp2_data_source source; nghttp2_data_source_read_callback read_callback; } nghttp2_data_provider;
typedef struct { int32_t stream_id; int32_t weight; uint8_t exclusive; } nghttp2_priority_spec;
typedef struct { nghttp2_frame_hd hd; size_t padlen; nghttp2_priority_spec pri_spec; nghttp2_nv *nva;
    size_t nvlen; int cat; } nghttp2_headers;
typedef struct { nghttp2_frame_hd hd; uint32_t error_code; } nghttp2_rst_stream;
typedef struct { nghttp2_frame_hd hd; int32_t last_stream_id; uint32_t error_code; uint8_t *opaque_data;
    size_t opaque_data_len; uint8_t reserved; } nghttp2_goaway;
typedef struct { nghttp2_frame_hd hd; int32_t window_size_increment; uint8_t reserved; } nghttp2_window_update;
typedef union { nghttp2_frame_hd hd; nghttp2_headers headers; nghttp2_rst_stream rst_stream;
    nghttp2_goaway goaway; nghttp2_window_update window_update; } nghttp2_frame;
typedef struct { int32_t settings_id; uint32_t value; } nghttp2_settings_entry;

typedef int (*nghttp2_on_frame_recv_callback)(uintptr_t, const nghttp2_frame_hd *, uintptr_t);
typedef int (*nghttp2_on_invalid_frame_recv_callback)(uintptr_t, const nghttp2_frame_hd *, int, uintptr_t);
typedef int (*nghttp2_on_header_callback)(uintptr_t, const nghttp2_frame_hd *, const char *name,
    size_t namelen, const char *value, size_t valuelen, uint8_t flags, uintptr_t);
typedef int (*nghttp2_on_data_chunk_recv_callback)(uintptr_t, uint8_t flags, int32_t stream_id,
    const char *data, size_t len, uintptr_t);
typedef int (*nghttp2_on_stream_close_callback)(uintptr_t, int32_t stream_id, uint32_t error_code, uintptr_t);
typedef int (*nghttp2_error_callback2)(uintptr_t, int lib_error_code, const char *msg, size_t len, uintptr_t);

nghttp2_info *nghttp2_version(int least_version);
const char *nghttp2_strerror(int lib_error_code);
int nghttp2_session_callbacks_new(nghttp2_session_callbacks **callbacks_ptr);
void nghttp2_session_callbacks_del(nghttp2_session_callbacks *callbacks);
void nghttp2_session_callbacks_set_on_frame_recv_callback(nghttp2_session_callbacks *, nghttp2_on_frame_recv_callback);
void nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(nghttp2_session_callbacks *,
    nghttp2_on_invalid_frame_recv_callback);
void nghttp2_session_callbacks_set_on_header_callback(nghttp2_session_callbacks *, nghttp2_on_header_callback);
void nghttp2_session_callbacks_set_on_data_chunk_recv_callback(nghttp2_session_callbacks *,
    nghttp2_on_data_chunk_recv_callback);
void nghttp2_session_callbacks_set_on_stream_close_callback(nghttp2_session_callbacks *, nghttp2_on_stream_close_callback);
void nghttp2_session_callbacks_set_error_callback2(nghttp2_session_callbacks *, nghttp2_error_callback2);
int nghttp2_option_new(nghttp2_option **option_ptr);
void nghttp2_option_del(nghttp2_option *option);
void nghttp2_option_set_no_auto_window_update(nghttp2_option *option, int val);
void nghttp2_option_set_max_settings(nghttp2_option *option, size_t val);
void nghttp2_option_set_max_outbound_ack(nghttp2_option *option, size_t val);
void nghttp2_option_set_stream_reset_rate_limit(nghttp2_option *option, uint64_t burst, uint64_t rate);
void nghttp2_option_set_max_continuations(nghttp2_option *option, size_t val);
int nghttp2_session_server_new2(nghttp2_session **session_ptr, const nghttp2_session_callbacks *callbacks,
    void *user_data, const nghttp2_option *option);
void nghttp2_session_del(nghttp2_session *session);
ssize_t nghttp2_session_mem_recv(nghttp2_session *session, const uint8_t *in, size_t inlen);
ssize_t nghttp2_session_mem_send(nghttp2_session *session, const char **data_ptr);
int nghttp2_session_want_read(nghttp2_session *session);
int nghttp2_session_want_write(nghttp2_session *session);
int nghttp2_submit_settings(nghttp2_session *session, uint8_t flags, const nghttp2_settings_entry *iv, size_t niv);
int nghttp2_session_set_local_window_size(nghttp2_session *session, uint8_t flags, int32_t stream_id,
    int32_t window_size);
int nghttp2_submit_response(nghttp2_session *session, int32_t stream_id, const nghttp2_nv *nva, size_t nvlen,
    const nghttp2_data_provider *data_prd);
int nghttp2_submit_rst_stream(nghttp2_session *session, uint8_t flags, int32_t stream_id, uint32_t error_code);
int nghttp2_submit_goaway(nghttp2_session *session, uint8_t flags, int32_t last_stream_id, uint32_t error_code,
    const uint8_t *opaque_data, size_t opaque_data_len);
int nghttp2_session_terminate_session(nghttp2_session *session, uint32_t error_code);
int32_t nghttp2_session_get_last_proc_stream_id(nghttp2_session *session);
int nghttp2_session_resume_data(nghttp2_session *session, int32_t stream_id);
int nghttp2_session_consume(nghttp2_session *session, int32_t stream_id, size_t size);
int32_t nghttp2_session_get_stream_remote_window_size(nghttp2_session *session, int32_t stream_id);
"""

# nghttp2_error
ERR_DEFERRED = -508
ERR_TEMPORAL_CALLBACK_FAILURE = -521
ERR_CALLBACK_FAILURE = -902
# nghttp2_frame_type
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE = range(9)
# nghttp2_flag
FLAG_END_STREAM = 0x01
FLAG_ACK = 0x01
# nghttp2_data_flag
DATA_FLAG_EOF = 0x01
# nghttp2_settings_id
SETTINGS_MAX_CONCURRENT_STREAMS = 0x03
SETTINGS_INITIAL_WINDOW_SIZE = 0x04
SETTINGS_MAX_FRAME_SIZE = 0x05
SETTINGS_MAX_HEADER_LIST_SIZE = 0x06
# nghttp2_headers_category
HCAT_REQUEST = 0


class SessionEvents(Protocol):
    """What a session's callbacks call: the receiver's own methods, with libnghttp2's C arguments
    as cffi passes them (`connection.H2ServerConnection`). Each returns 0, or one of the library's
    error codes to refuse the frame (a stream error) or end the session. Only the callbacks the
    server needs are set: each one is a call from C into Python, and each is one Python frame, not
    an adapter's frame and then the receiver's."""

    def on_header(
        self, session: Any, hd: Any, name: Any, namelen: int, value: Any, valuelen: int, flags: int, user_data: Any
    ) -> int:
        """One decoded header (`hd` is the frame's header)."""
        ...

    def on_frame_recv(self, session: Any, hd: Any, user_data: Any) -> int: ...

    def on_invalid_frame(self, session: Any, hd: Any, error: int, user_data: Any) -> int: ...

    def on_data(self, session: Any, flags: int, stream_id: int, data: Any, length: int, user_data: Any) -> int: ...

    def on_stream_close(self, session: Any, stream_id: int, error_code: int, user_data: Any) -> int: ...

    def read_body(
        self, session: Any, stream_id: int, buf: Any, length: int, flags: Any, source: Any, user_data: Any
    ) -> int: ...

    def on_error(self, session: Any, code: int, message: Any, length: int, user_data: Any) -> int: ...


class HeaderBlocks:
    """One session's header block as the compiled callback collects it (native/h2blocks.c): the
    stream's limit and what the connection's leaves bound it as it is decoded, as the Python
    collector does (`connection.H2ServerConnection.on_header`); Python takes it once, complete."""

    __slots__ = ("_block", "_clear", "_free", "_max_held", "_unpack", "user_data")

    def __init__(self, compiled: Any, unpack: Callable[[Any, int], Any], options: SessionOptions) -> None:
        ffi, lib = compiled.ffi, compiled.lib
        self._block = block = ffi.new("agg_block *")
        block.max_list = options.max_header_list_size
        block.room_held = self._max_held = options.max_header_bytes_held
        self._clear = lib.agg_block_clear
        self._free = lib.agg_block_free
        self._unpack = unpack
        self.user_data = int(ffi.cast("uintptr_t", block))

    def __del__(self) -> None:
        self._free(self._block)

    def take(self, stream_id: int) -> tuple[list[tuple[bytes, bytes]], int, bool]:
        """The block a HEADERS frame of `stream_id` completed: its fields, their size and whether
        it went past its limit (no fields then). Empty when the fields decoded were another
        stream's (a block libnghttp2 refused midway) or there were none."""
        block = self._block
        if block.stream != stream_id:
            if block.stream:
                self._clear(block)
            return [], 0, False
        count = block.count
        result: list[tuple[bytes, bytes]] = []
        if count:
            data: bytes = self._unpack(block.data, block.used)
            parts = data.split(b"\0")
            if len(parts) == 2 * count + 1:
                pairs = iter(parts)
                result = list(zip(pairs, pairs, strict=False))
            else:  # a NUL inside a field (libnghttp2 refuses them in values): by the lengths
                result = _by_lengths(data, self._unpack(block.lens, 2 * count))
        size, too_large = block.bytes, bool(block.too_large)
        self._clear(block)
        return result, size, too_large

    def drop(self, stream_id: int) -> None:
        """The block of `stream_id`, if it is the one being collected, is not completed: its
        fields go."""
        block = self._block
        if block.stream == stream_id:
            self._clear(block)

    def held(self, header_bytes: int) -> None:
        """The connection's live streams now hold `header_bytes` of decoded headers."""
        self._block.room_held = self._max_held - header_bytes


def _by_lengths(data: bytes, lengths: list[int]) -> list[tuple[bytes, bytes]]:
    fields: list[tuple[bytes, bytes]] = []
    at = 0
    for index in range(0, len(lengths), 2):
        name_end = at + lengths[index]
        value_end = name_end + 1 + lengths[index + 1]
        fields.append((data[at:name_end], data[name_end + 1 : value_end]))
        at = value_end + 1
    return fields


class Session:
    """One server session: its handle (freed when this is collected), its data provider, the
    callbacks bound to its receiver, kept alive as long as the session may call them, and its
    compiled header collector (None where headers go to the receiver's `on_header`)."""

    __slots__ = ("_callbacks", "blocks", "data_provider", "handle")

    def __init__(
        self, handle: Any, data_provider: Any, callbacks: tuple[Any, ...], blocks: HeaderBlocks | None
    ) -> None:
        self.handle = handle
        self.data_provider = data_provider
        self._callbacks = callbacks
        self.blocks = blocks


def _failed(exception: Any, exc_value: Any, traceback: Any) -> None:
    log.error("HTTP/2 callback failed", exc_info=(exception, exc_value, traceback))


class Nghttp2:
    """The loaded library (see the module docstring)."""

    def __init__(self, ffi: Any, lib: Any, compiled: Any = None) -> None:
        self.ffi = ffi
        self.lib = lib
        # The compiled header callback's module (`_h2blocks`), or None: headers go to Python.
        self.compiled = compiled
        self._on_header = None
        if compiled is not None:
            address = int(compiled.ffi.cast("uintptr_t", compiled.ffi.addressof(compiled.lib, "agg_on_header")))
            self._on_header = ffi.cast("nghttp2_on_header_callback", address)
        info = lib.nghttp2_version(0)
        self.version = ffi.string(info.version_str).decode()
        self.has_reset_rate_limit = _has(lib, "nghttp2_option_set_stream_reset_rate_limit")
        self.has_max_continuations = _has(lib, "nghttp2_option_set_max_continuations")
        # `ffi.memmove` without its Python-level wrapper: one call fewer per answer's body.
        self.memmove = ffi._backend.memmove
        # mem_send's `const uint8_t **` declared `const char **`: `unpack` then gives bytes at once.
        self.out = ffi.new("const char **")
        # `const char *` and a length: the exact bytes, NUL or not (`ffi.unpack` without its
        # Python-level wrapper, which would be one more call per header).
        self.unpack = ffi._backend.unpack

    def _callbacks(self, events: SessionEvents) -> tuple[Any, tuple[Any, ...]]:
        """A callbacks structure whose callbacks are `events`' bound methods (the session copies
        the structure; the callbacks themselves must outlive it), the header callback the compiled
        one where it is loaded."""
        ffi, lib = self.ffi, self.lib

        def made(kind: str, method: Callable[..., int]) -> Any:
            return ffi.callback(kind, method, onerror=_failed, error=ERR_CALLBACK_FAILURE)

        keep = (
            self._on_header or made("nghttp2_on_header_callback", events.on_header),
            made("nghttp2_on_frame_recv_callback", events.on_frame_recv),
            made("nghttp2_on_invalid_frame_recv_callback", events.on_invalid_frame),
            made("nghttp2_on_data_chunk_recv_callback", events.on_data),
            made("nghttp2_on_stream_close_callback", events.on_stream_close),
            made("nghttp2_error_callback2", events.on_error),
            made("nghttp2_data_source_read_callback", events.read_body),
        )
        holder = ffi.new("nghttp2_session_callbacks **")
        if lib.nghttp2_session_callbacks_new(holder) != 0:
            raise MemoryError("nghttp2_session_callbacks_new failed")
        callbacks = ffi.gc(holder[0], lib.nghttp2_session_callbacks_del)
        lib.nghttp2_session_callbacks_set_on_header_callback(callbacks, keep[0])
        lib.nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, keep[1])
        lib.nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(callbacks, keep[2])
        lib.nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, keep[3])
        lib.nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, keep[4])
        lib.nghttp2_session_callbacks_set_error_callback2(callbacks, keep[5])
        return callbacks, keep

    def new_session(self, options: SessionOptions, events: SessionEvents) -> Session:
        """A server session whose callbacks are `events`' methods."""
        ffi, lib = self.ffi, self.lib
        callbacks, keep = self._callbacks(events)
        option_holder = ffi.new("nghttp2_option **")
        if lib.nghttp2_option_new(option_holder) != 0:
            raise MemoryError("nghttp2_option_new failed")
        option = ffi.gc(option_holder[0], lib.nghttp2_option_del)
        # The handler reads the body: window goes back to the client only as it does.
        lib.nghttp2_option_set_no_auto_window_update(option, 1)
        lib.nghttp2_option_set_max_settings(option, options.max_settings_per_frame)
        lib.nghttp2_option_set_max_outbound_ack(option, options.max_queued_control_frames)
        if self.has_reset_rate_limit:
            # A backstop behind the connection's own reset budget (which counts the same resets
            # and names the limit in its log line and metric): twice as generous.
            lib.nghttp2_option_set_stream_reset_rate_limit(
                option, 2 * options.reset_burst, int(2 * options.reset_rate)
            )
        if self.has_max_continuations:
            lib.nghttp2_option_set_max_continuations(option, options.max_continuations)
        blocks = None
        user_data = ffi.NULL
        if self.compiled is not None:
            blocks = HeaderBlocks(self.compiled, self.unpack, options)
            user_data = ffi.cast("void *", blocks.user_data)  # what the compiled callback collects into
        holder = ffi.new("nghttp2_session **")
        code = lib.nghttp2_session_server_new2(holder, callbacks, user_data, option)
        if code != 0:
            raise MemoryError(f"nghttp2_session_server_new2: {self.error(code)}")
        data_provider = ffi.new("nghttp2_data_provider *")
        data_provider.read_callback = keep[6]
        return Session(ffi.gc(holder[0], lib.nghttp2_session_del), data_provider, keep, blocks)

    def error(self, code: int) -> str:
        return str(self.ffi.string(self.lib.nghttp2_strerror(code)).decode())


class SessionOptions(Protocol):
    """The limits a session enforces itself (`limits.H2Limits`)."""

    @property
    def max_settings_per_frame(self) -> int: ...

    @property
    def max_queued_control_frames(self) -> int: ...

    @property
    def reset_burst(self) -> int: ...

    @property
    def reset_rate(self) -> float: ...

    @property
    def max_continuations(self) -> int: ...

    @property
    def max_header_list_size(self) -> int: ...

    @property
    def max_header_bytes_held(self) -> int: ...


def _has(lib: Any, name: str) -> bool:
    try:
        getattr(lib, name)
    except AttributeError:
        return False
    return True


def _candidates() -> list[str]:
    named = os.environ.get(LIBRARY_ENV)
    if named is not None:
        return [named]
    found = ctypes.util.find_library("nghttp2")
    return [*LIBRARY_NAMES, *([found] if found else [])]


def _compiled(wanted: bool | None) -> tuple[Any, str]:
    """The compiled header callback's module, or None, and which collects header blocks."""
    if wanted is None:
        wanted = os.environ.get(COMPILED_ENV, "1") != "0"
    if not wanted:
        return None, f"header blocks collected in Python ({COMPILED_ENV}=0)"
    try:
        return importlib.import_module(COMPILED_MODULE), "header blocks collected in C"
    except ImportError as err:
        return None, f"header blocks collected in Python (the compiled callback was not built: {err})"


def load(*, compiled: bool | None = None) -> tuple[Nghttp2 | None, str]:
    """The library, or None and why not (the server then offers HTTP/1.1 only). `compiled`: the
    compiled header callback if installed (None: unless `AGGREGATOR_HTTP2_COMPILED=0`), or not."""
    try:
        from cffi import FFI
    except ImportError as err:  # cffi comes with cryptography: only a broken install lacks it
        return None, f"cffi is not importable: {err}"
    ffi = FFI()
    ffi.cdef(CDEF)
    reasons = []
    for name in _candidates():
        try:
            lib = ffi.dlopen(name)
        except OSError as err:
            reasons.append(f"{name}: {err}")
            continue
        module, how = _compiled(compiled)
        binding = Nghttp2(ffi, lib, module)
        version = tuple(int(part) for part in binding.version.split(".")[:3] if part.isdigit())
        if version < MINIMUM_VERSION:
            minimum = ".".join(map(str, MINIMUM_VERSION))
            return None, f"{name} is nghttp2 {binding.version}; HTTP/2 needs {minimum} or newer"
        return binding, f"nghttp2 {binding.version}, {how}"
    return None, "libnghttp2 was not found (" + "; ".join(reasons) + ")"
