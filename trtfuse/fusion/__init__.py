"""Find the norms of an ONNX graph and rewrite them into the contract's plugin nodes."""
