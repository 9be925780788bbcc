"""The certificates a TLS client sent after its own: the intermediates Go verifies with.

kube-apiserver's x509 authenticator passes `req.TLS.PeerCertificates[1:]` as the Intermediates pool
(k8s.io/apiserver pkg/authentication/request/x509/x509.go, `AuthenticateRequest`). Python's ssl
module only exposes the peer's own certificate before 3.13 (`get_unverified_chain`), so on 3.11 we
read OpenSSL's `SSL_get_peer_cert_chain` through ctypes, on the `SSL *` behind the ssl object (as
aggregator/tls/peer.py does for the `SSL_CTX *`). On the server side that stack holds what the client
sent after its leaf, unverified: exactly Go's list. Both asyncio's and uvloop's transports expose an
`ssl.SSLObject` whose `_sslobj` is the `_ssl._SSLSocket` wrapping the `SSL *`.

The struct layout is checked once, at construction, on a throwaway in-memory connection (the pointer
read must be an `SSL *` whose `SSL_CTX *` is the one Python reports); if it does not match, or the
symbols are missing, every connection reads as "no intermediates" and a warning says so.
"""

from __future__ import annotations

import _ssl
import ctypes
import logging
import ssl
from typing import Protocol

log = logging.getLogger(__name__)

_POINTER = ctypes.sizeof(ctypes.c_void_p)
# PySSLSocket (Modules/_ssl.c): PyObject_HEAD (refcount, type), `PyObject *Socket`, then `SSL *ssl`.
_SSL_OFFSET = 3 * _POINTER
# PySSLContext: PyObject_HEAD, then `SSL_CTX *ctx`.
_SSL_CTX_OFFSET = 2 * _POINTER
_SSL_SOCKET: type = _ssl._SSLSocket  # type: ignore[attr-defined]


class IntermediatesReader(Protocol):
    """What the authenticators need: the DER certificates a peer sent after its leaf."""

    def intermediates(self, ssl_object: object) -> tuple[bytes, ...]: ...


def _pointer_at(obj: object, offset: int) -> int | None:
    value = ctypes.c_void_p.from_address(id(obj) + offset).value
    return int(value) if value else None


class _LibSSL:
    """The few libssl/libcrypto calls needed, resolved through the `_ssl` extension's own libraries."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(_ssl.__file__)
        self.get_peer_cert_chain = lib.SSL_get_peer_cert_chain
        self.get_peer_cert_chain.argtypes = [ctypes.c_void_p]
        self.get_peer_cert_chain.restype = ctypes.c_void_p
        self.get_ssl_ctx = lib.SSL_get_SSL_CTX
        self.get_ssl_ctx.argtypes = [ctypes.c_void_p]
        self.get_ssl_ctx.restype = ctypes.c_void_p
        self.sk_num = lib.OPENSSL_sk_num
        self.sk_num.argtypes = [ctypes.c_void_p]
        self.sk_num.restype = ctypes.c_int
        self.sk_value = lib.OPENSSL_sk_value
        self.sk_value.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.sk_value.restype = ctypes.c_void_p
        self.i2d_x509 = lib.i2d_X509
        self.i2d_x509.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.i2d_x509.restype = ctypes.c_int

    def der(self, x509: int) -> bytes | None:
        size = self.i2d_x509(x509, None)
        if size <= 0:
            return None
        buffer = (ctypes.c_ubyte * size)()
        cursor = ctypes.cast(buffer, ctypes.POINTER(ctypes.c_ubyte))  # i2d_X509 advances it
        if self.i2d_x509(x509, ctypes.byref(cursor)) != size:
            return None
        return bytes(buffer)


def _layout_matches(lib: _LibSSL) -> bool:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    probe = ctx.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_side=True)
    sslobj = getattr(probe, "_sslobj", None)
    if type(sslobj) is not _SSL_SOCKET:
        return False
    ssl_pointer = _pointer_at(sslobj, _SSL_OFFSET)
    ctx_pointer = _pointer_at(ctx, _SSL_CTX_OFFSET)
    return ssl_pointer is not None and ctx_pointer is not None and lib.get_ssl_ctx(ssl_pointer) == ctx_pointer


class PeerChainReader:
    """Reads the client's intermediates from an `ssl.SSLObject`; costs two C calls when there are none."""

    def __init__(self) -> None:
        self._lib: _LibSSL | None = None
        if hasattr(ssl.SSLObject, "get_unverified_chain"):
            return  # Python 3.13+: the ssl module says it itself.
        try:
            lib = _LibSSL()
            if not _layout_matches(lib):
                raise OSError("the _ssl socket layout is not the one expected")
            self._lib = lib
        except (OSError, AttributeError) as err:
            log.warning(
                "cannot read the certificates TLS clients send after their own (%s): client "
                "certificates issued by an intermediate CA will not verify",
                err,
            )

    @property
    def available(self) -> bool:
        return self._lib is not None or hasattr(ssl.SSLObject, "get_unverified_chain")

    def intermediates(self, ssl_object: object) -> tuple[bytes, ...]:
        unverified = getattr(ssl_object, "get_unverified_chain", None)
        if unverified is not None:
            chain = unverified() or []
            return tuple(bytes(c) for c in chain[1:])  # the 3.13 list starts with the peer's own
        lib = self._lib
        sslobj = getattr(ssl_object, "_sslobj", None)
        if lib is None or type(sslobj) is not _SSL_SOCKET:
            return ()
        pointer = _pointer_at(sslobj, _SSL_OFFSET)
        if pointer is None:
            return ()
        stack = lib.get_peer_cert_chain(pointer)
        if not stack:
            return ()
        out: list[bytes] = []
        for i in range(lib.sk_num(stack)):
            der = lib.der(lib.sk_value(stack, i))
            if der is not None:
                out.append(der)
        return tuple(out)
