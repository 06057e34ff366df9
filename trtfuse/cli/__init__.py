"""The `trtfuse` command line: click commands that are thin wrappers over the trtfuse modules."""
