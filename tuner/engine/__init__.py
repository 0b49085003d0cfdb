"""Models and texts → vectors: loading (registry, attention probe), the one forward loop (plain, calibrated,
resumed from a middle layer), the exported YAML config and the sentence-transformers loader."""
