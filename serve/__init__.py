"""serve: see docs/architecture.md."""
