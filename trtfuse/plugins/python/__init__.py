"""Python IPluginV3 plugins for the fused nodes, backed by trtfuse.kernels: one creator per op of the contract
(`rms_norm.py`, `qk_norm.py`, `add_rms_norm.py` over `base.py`; fields through the contract's codec in `fields.py`).
Importing any of them imports TensorRT (`trt_module.load_trt`)."""
