"""gguf2ov: GGUF speculative-decoding drafts to verified OpenVINO IR drafts."""

__version__ = "0.1.0"
