"""Task types, loaders and generated data (the synthetic task engine grows here)."""
