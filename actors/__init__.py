"""actors: see docs/architecture.md."""
