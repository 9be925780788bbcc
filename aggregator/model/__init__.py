"""Pure data and rules: no I/O, no asyncio. Everything here is tested without sockets."""
