"""trtfuse: fuse the RMSNorms and QK-norms of an ONNX LLM into CuTeDSL-backed TensorRT plugins."""

__version__ = "0.1.0"
