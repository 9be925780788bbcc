"""Discovery: `/apis` and `/apis/<group>` (legacy), the aggregated document, and backend fetching."""
