"""TensorRT plugins for the fused nodes of the contract, backed by the CuTeDSL kernels of trtfuse.kernels: the Python
IPluginV3 plugins (`python/`) and the AOT quickly deployable plugins (`qdp.py`), registered through `registry.py`.

Importing this package needs neither TensorRT nor a GPU.
"""
