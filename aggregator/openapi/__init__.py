"""OpenAPI aggregation: `/openapi/v3` (index and per group-version documents) and a merged `/openapi/v2`.

Backends and, in kube mode, kube-apiserver are fetched in the background (`sources.py`, driven by
`component.py`); what is served is always pre-rendered bytes with their ETags (`documents.py`,
`routes.py`).
"""
