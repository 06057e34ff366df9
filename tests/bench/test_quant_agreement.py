"""The quant benchmark's agreement count: what it reports of torch.compile's codes, and what stops it for ours."""

import pytest
import torch

from trtfuse.bench.aot.compare import quantization_step
from trtfuse.bench.quant import OUTPUTS, check_quantized, quantized_agreement
from trtfuse.contract import Quantizer


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


def test_the_e4m3fn_step_is_the_spacing_of_the_codes_at_and_just_below_each_power_of_two() -> None:
    """At 2^k the next code up is 2^(k-3) away (the step of 2^k's own binade), just below it half that; below 2^-6
    the subnormals' 2^-9."""
    quantizer = Quantizer("float8_e4m3fn", 0.25)
    powers = torch.tensor([2.0**k for k in range(-6, 9)], dtype=torch.float64)
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        at = quantization_step(powers.to(device) * 0.25, quantizer).cpu()
        below = quantization_step(torch.nextafter(powers, torch.zeros(())).to(device) * 0.25, quantizer).cpu()
        assert torch.equal(at, powers / 8 * 0.25)
        assert torch.equal(below[1:], powers[1:] / 16 * 0.25) and below[0] == 2.0**-9 * 0.25
