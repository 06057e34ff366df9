"""The quant benchmark's agreement count: what it reports of torch.compile's codes, and what stops it for ours."""

import pytest
import torch

from trtfuse.bench.quant import OUTPUTS, check_quantized, quantized_agreement


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_codes_one_step_off_agree_and_two_steps_off_do_not(name: str) -> None:
    quantizer = OUTPUTS[name]
    dtype = torch.int8 if quantizer.dtype == "int8" else torch.float8_e4m3fn
    reference = (torch.linspace(-3.0, 3.0, 64).reshape(2, 32) / quantizer.scale).to(dtype)
    assert quantized_agreement(reference, reference, quantizer)["equal"] == 64
    out = reference.clone()
    bits = out.view(torch.uint8) if dtype != torch.int8 else out.view(torch.int8)
    bits[1, 5] += 1  # one step (E4M3FN: the next code in the same binade)
    agreement = check_quantized(out, reference, quantizer, "ours")
    assert (agreement["equal"], agreement["one_step"], agreement["beyond"]) == (63, 1, 0)
    bits[1, 5] += 2  # three steps off
    agreement = quantized_agreement(out, reference, quantizer)
    assert agreement["beyond"] == 1 and agreement["worst"]["row"] == 1 and agreement["worst"]["column"] == 5
    with pytest.raises(AssertionError, match="more than a step"):
        check_quantized(out, reference, quantizer, "ours")
