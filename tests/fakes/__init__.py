"""Stand-ins for TensorRT's objects, shared by the tests of the TensorRT side."""
