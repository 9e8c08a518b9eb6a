"""curriculum: see docs/architecture.md."""
