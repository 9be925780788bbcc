"""API Priority and Fairness: kube-apiserver's FlowSchemas and priority levels, its fair queuing and
seat borrowing, in the gateway's request path (`runtime.py` for how it fits together)."""
