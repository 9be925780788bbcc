"""`aggregator_certificate_expiration_seconds`: when each certificate the gateway depends on expires.

The value is the Unix time of the certificate's notAfter, as kubelet's
`kubelet_certificate_manager_client_expiration_seconds`, cert-manager's
`certmanager_certificate_expiration_timestamp_seconds` and blackbox_exporter's
`probe_ssl_earliest_cert_expiry` report it: it changes only when a certificate does, so it needs
no clock at scrape time, and `aggregator_certificate_expiration_seconds - time() < 7 * 86400`
alerts a week ahead. (kube-apiserver exposes no expiry for its own files; its
`apiserver_client_certificate_expiration_seconds` is a histogram of client certificates seen.)

A file may hold several certificates (a chain, or a CA bundle mid-rotation): the earliest notAfter
counts, as blackbox_exporter's `earliest` does, since that is when something in the file first
stops verifying.

Labels: `certificate` says which one (`serving`, `proxy-client`, `client-ca`,
`requestheader-client-ca`, named after their flags) and `source` where it was read from (the file
path, or `configmap/kube-system/extension-apiserver-authentication` when kube mode reads a CA from
kube-apiserver's ConfigMap).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from cryptography import x509
from prometheus_client.core import GaugeMetricFamily, Metric

from aggregator.tls.pem import parse_certificates

SERVING = "serving"  # --tls-cert-file
PROXY_CLIENT = "proxy-client"  # --proxy-client-cert-file
CLIENT_CA = "client-ca"  # --client-ca-file, or the ConfigMap's client-ca-file
REQUESTHEADER_CLIENT_CA = "requestheader-client-ca"  # --requestheader-client-ca-file, or the ConfigMap's
AUTHENTICATION_CONFIGMAP = "configmap/kube-system/extension-apiserver-authentication"

# Where a certificate was read from, and the certificates read (the earliest notAfter counts).
CertificateSource = tuple[str, Sequence[x509.Certificate]]


def earliest_not_after(certificates: Iterable[x509.Certificate]) -> float:
    """The Unix time at which the first of `certificates` expires."""
    return min(cert.not_valid_after_utc.timestamp() for cert in certificates)


class CertificateExpiry:
    """The collector, and the holder the certificate loaders report to: one series per certificate
    kind, replaced whenever its loader (re)reads it."""

    NAME = "aggregator_certificate_expiration_seconds"
    HELP = (
        "Unix time at which the certificate expires (the earliest notAfter in its file), by certificate "
        "(serving, proxy-client, client-ca, requestheader-client-ca) and source (file or ConfigMap)."
    )

    def __init__(self) -> None:
        self._values: dict[str, tuple[str, float]] = {}
        self._sources: dict[str, Callable[[], CertificateSource | None]] = {}

    def follow(self, certificate: str, read: Callable[[], CertificateSource | None]) -> None:
        """Read `certificate` from its holder at every scrape (CA pools swapped by a file reload or
        the cluster's ConfigMap, the serving pair): the series always shows what is in use now."""
        self._sources[certificate] = read

    def set(self, certificate: str, source: str, not_after: float) -> None:
        self._values[certificate] = (source, not_after)

    def set_certificates(
        self, certificate: str, source: str, certificates: Iterable[x509.Certificate]
    ) -> None:
        self.set(certificate, source, earliest_not_after(certificates))

    def set_pem(self, certificate: str, source: str, pem: bytes) -> None:
        """From PEM text as the loaders hold it; raises `PEMError` as they would on bad input."""
        self.set_certificates(certificate, source, parse_certificates(pem, source=source))

    def forget(self, certificate: str) -> None:
        self._values.pop(certificate, None)

    def value(self, certificate: str) -> tuple[str, float] | None:
        return self._current().get(certificate)

    def _current(self) -> dict[str, tuple[str, float]]:
        values = dict(self._values)
        for certificate, read in self._sources.items():
            found = read()
            if found is not None and found[1]:
                values[certificate] = (found[0], earliest_not_after(found[1]))
        return values

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["certificate", "source"])
        for certificate, (source, not_after) in sorted(self._current().items()):
            family.add_metric([certificate, source], not_after)
        yield family
