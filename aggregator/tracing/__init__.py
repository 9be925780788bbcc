"""OpenTelemetry tracing of every request, as kube-apiserver does it (`--tracing-config-file`).

- `config.py`: the `apiserver.config.k8s.io` TracingConfiguration file, read and validated with
  upstream's messages (pure: no OpenTelemetry import);
- `options.py`: the flag, its refusals, and what it builds;
- `api.py`: what the request path sees of a request's trace (`RequestSpan`): one field on the
  request context and one call at each phase boundary, free when nothing is sampled;
- `otel.py`: those spans over the OpenTelemetry SDK, exported over OTLP/gRPC (the optional
  `aggregator[tracing]` dependencies, imported only when the flag is given);
- `gates.py`: the authentication, authorization and fairness gates wrapped in their phase spans.
"""
