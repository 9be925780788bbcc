"""Ask TLS clients for a certificate without letting OpenSSL judge it.

kube-apiserver requests a client certificate during the handshake and verifies it afterwards, in the
authenticator, against the right CA pool (client CA or front-proxy CA). A bad certificate is then a
401 Status with a logged reason instead of a TLS alert the user cannot read, and both pools stay
separate. Python's ssl module can only make OpenSSL verify during the handshake, against one merged
store, so we install an accept-all verify callback on the context's SSL_CTX through ctypes; the
authenticator verifies the certificate itself with cryptography.
"""

from __future__ import annotations

import _ssl
import ctypes
import logging
import ssl
from collections.abc import Callable

log = logging.getLogger(__name__)

_SSL_VERIFY_PEER = 0x01
_VerifyCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


def _accept_any(_preverify_ok: int, _store: int | None) -> int:
    return 1


# Kept alive for the life of the process: OpenSSL holds a raw pointer to it.
_ACCEPT_ANY = _VerifyCallback(_accept_any)


def _libssl() -> ctypes.CDLL:
    # dlsym on the _ssl extension resolves through its own dependencies, i.e. the libssl it uses.
    lib = ctypes.CDLL(_ssl.__file__)
    lib.SSL_CTX_set_verify.argtypes = [ctypes.c_void_p, ctypes.c_int, _VerifyCallback]
    lib.SSL_CTX_set_verify.restype = None
    lib.SSL_CTX_get_verify_mode.argtypes = [ctypes.c_void_p]
    lib.SSL_CTX_get_verify_mode.restype = ctypes.c_int
    return lib


def _ssl_ctx_pointer(ctx: ssl.SSLContext) -> int | None:
    # PySSLContext starts with PyObject_HEAD followed by `SSL_CTX *ctx`.
    value = ctypes.c_void_p.from_address(id(ctx) + 2 * ctypes.sizeof(ctypes.c_ssize_t)).value
    return int(value) if value else None


def _pointer_is_ssl_ctx(lib: ctypes.CDLL, ctx: ssl.SSLContext, pointer: int) -> bool:
    """Cross-check the pointer by flipping the verify mode through Python and reading it back."""
    original = ctx.verify_mode
    try:
        for mode, expected in ((ssl.CERT_REQUIRED, 0x03), (ssl.CERT_OPTIONAL, 0x01)):
            ctx.verify_mode = mode
            if lib.SSL_CTX_get_verify_mode(pointer) != expected:
                return False
        return True
    finally:
        ctx.verify_mode = original


def request_client_certificates(ctx: ssl.SSLContext, fallback_cafiles: Callable[[], list[str]]) -> bool:
    """Make `ctx` request (not require, not judge) client certificates.

    Returns True when the accept-all callback is installed. Otherwise OpenSSL verifies against
    `fallback_cafiles()` during the handshake (a certificate from an unknown CA then fails the
    handshake instead of getting a 401), and a warning says so.
    """
    ctx.verify_mode = ssl.CERT_OPTIONAL
    try:
        lib = _libssl()
        pointer = _ssl_ctx_pointer(ctx)
        if pointer is None or not _pointer_is_ssl_ctx(lib, ctx, pointer):
            raise OSError("SSL_CTX pointer layout not recognised")
        lib.SSL_CTX_set_verify(pointer, _SSL_VERIFY_PEER, _ACCEPT_ANY)
        return True
    except (OSError, AttributeError) as err:
        for cafile in fallback_cafiles():
            ctx.load_verify_locations(cafile=cafile)
        log.warning(
            "client certificates are verified during the TLS handshake (%s): a certificate from an "
            "unknown CA fails the handshake instead of getting a 401",
            err,
        )
        return False
