"""Per-architecture GGUF -> Hugging Face maps (YAML), shipped as package data."""
