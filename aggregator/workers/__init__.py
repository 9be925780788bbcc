"""`aggregator serve --workers N`: N processes serve the port, one control process feeds them."""
