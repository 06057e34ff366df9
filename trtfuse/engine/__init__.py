"""TensorRT engines: profiles, build, the engine file and sidecar, run, compare, leak check."""
