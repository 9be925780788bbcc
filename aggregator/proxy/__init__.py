"""The reverse proxy: extension API servers (APIService backends) and kube-apiserver (the delegate).

`apiservices` serves the group-versions of remote APIServices, `forward` streams one request to
one destination, `upgrade` tunnels exec/attach/port-forward, `delegate` forwards everything else
to kube-apiserver in kube mode. How backends are reached lives in `aggregator.backends`.
"""
