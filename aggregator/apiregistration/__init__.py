"""Local mode's read-only `apiregistration.k8s.io/v1`: `documents` encodes, `selectors` filters,
`api` serves list, get and watch of the store's APIServices."""
