"""The reverse proxy: extension API servers (APIService backends) and kube-apiserver (the delegate).

`resolver` picks the address to dial, `transport` owns TLS contexts and connection pools (and the
`fetch` other components use), `headers` decides what crosses the gateway, `handler` streams
requests, `upgrade` tunnels exec/attach/port-forward, `delegate` forwards everything else in kube mode.
"""
