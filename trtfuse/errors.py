"""The one exception type users see: a single line naming the file, node or tensor at fault."""


class TrtfuseError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


class MissingDependencyError(TrtfuseError):
    """An optional dependency (TensorRT, a GPU, CuTeDSL...) is not available; the message says how to get it."""
