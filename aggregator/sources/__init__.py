"""Where objects come from (a folder or kube-apiserver) and the store that holds them."""
