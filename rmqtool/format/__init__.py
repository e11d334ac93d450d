"""Pure format layer: bytes (or a memoryview) and an offset in, immutable values out; each encoder
beside its decoder. Nothing here opens a file."""
