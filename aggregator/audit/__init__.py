"""Audit log like kube-apiserver's: audit.k8s.io/v1 policy, Event JSON lines, lumberjack rotation.

Modules: `policy` (which requests, which level), `event` (the JSON line), `body` (bounded body
capture), `sinks` (stdout, file, rotation), `writer` (the queue and its thread), `recorder` (the
API the request pipeline calls), `factory` (flags to an Auditor). See docs/audit.md.
"""
