"""Drives the trtfuse plugins through TensorRT's documented IPluginV3 call order, without a TensorRT engine.

TensorRT cannot run here, so this harness plays the builder's and the execution context's part, in their order:

  build:   creator.create_plugin(BUILD) -> get_capability_interface(CORE, BUILD, RUNTIME) -> num_outputs
           -> get_output_data_types -> get_output_shapes -> supports_format_combination (every position, every
           dtype) -> configure_plugin -> timing_cache_id -> set_tactic(0) -> get_fields_to_serialize
  runtime: creator.create_plugin(RUNTIME) from the serialised fields -> attach_to_context -> clone
           -> set_tactic(0) -> on_shape_change -> enqueue (raw device pointers, a non-default stream) -> destroy

The build and runtime steps up to `on_shape_change` (cases, descriptors, phases) need only the TensorRT types;
`enqueue`, the host-cost measurement and the CUDA-graph replay need a GPU, torch and trtfuse.kernels, which those
modules import inside their functions. What it cannot reproduce: TensorRT's own IExprBuilder (not constructible
outside a network build, so get_output_shapes sees expression-less DimsExprs) and an IPluginResourceContext
(attach_to_context gets None; the plugins do not use it).

Every op of the contract goes through the same steps: a case, its descriptors, the launch arguments and the output
checks read the op's tables (`contract.FusedOp`), so the residual add + RMSNorm (two activations in one part, a
normalised y and the sum h, which must match the reference's rounded sum bit for bit) needs no step of its own. A
rotary op's tables (`FusedOp.rotary_tables`) are inputs like the others: [Bc, S, R] from the first activation's shape
and the node's layout, filled as real rotary tables, and its rotated outputs are judged by the AOT check's rule for
rotary parts against `qk_norm_rope_reference` (`outputs.rotated_check`).

Run `python -m trtfuse.bench.lifecycle` on a GPU machine for a report of every case.
"""
