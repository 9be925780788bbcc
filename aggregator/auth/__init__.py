"""Who is calling (authentication) and may they (authorization)."""
