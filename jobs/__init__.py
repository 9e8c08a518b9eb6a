"""jobs: see docs/architecture.md."""
