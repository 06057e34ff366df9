"""Load and save ONNX models, read what their inputs mean, make the feeds that run them."""
