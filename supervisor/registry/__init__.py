"""The registry: the single source of truth for every job row."""
