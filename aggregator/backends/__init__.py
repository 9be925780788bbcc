"""How the gateway reaches extension API servers (and kube-apiserver): addresses, TLS, connections.

`addresses` turns an APIService into the IP to dial (with the deny list); `tls` builds client
contexts; `client_cert` holds the front-proxy certificate; `backend` dials and pools connections
and words every failure as Go would (`errors`, `tlsdiag`); `h1` is the lean HTTP/1.1 client all
of them share; `registry` keeps one backend per TLS setting and makes the gateway's own GETs;
`headers` decides which headers cross. aiohttp internals are used only through `_aiohttp`.
"""
