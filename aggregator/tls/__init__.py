"""TLS plumbing shared by the server side (serving certificates) and the client side (backends)."""
