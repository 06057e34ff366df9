"""Greedy generation: the model fed a prompt, then one token at a time with the cache it returns.

`interface` reads what each input and output of a model is for generation (token ids, mask, positions, cache pairs,
length inputs, logits) from `trtfuse.model.dims`; `loop` is the greedy loop over any step function; `runners` gives
the step functions (a model on the CPU, as `check` runs it, or an engine through `EngineSession`); `agreement`
judges two generations from the same prompt (`check --generate`, `compare --generate`).
"""
