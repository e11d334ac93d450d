"""Store layer: files, names, offsets. Reads through the pure format layer."""
