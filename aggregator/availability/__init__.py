"""Availability of every APIService: hop-by-hop checks, the `Available` condition, metrics.

`probe` walks the hops (Service, port, EndpointSlices, the discovery GET), `conditions` words the
verdict as upstream does (plus the detail upstream lacks), `checker` re-checks and answers the
proxy, `status` records conditions (store, memory, or kube-apiserver's status subresource).
"""
