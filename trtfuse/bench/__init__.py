"""Test and benchmark harnesses: the plugin lifecycle driver, the kernel benchmark and the torch reference they share.

Nothing in the runtime packages imports from here; these modules may import torch at module top (the runtime may not).
"""
