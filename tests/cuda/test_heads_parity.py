"""Every head against transformers on CUDA, on a batch with full, right-padded and interior-padded rows
(each starting with a real [CLS]: where position 0 is padding, transformers' pooled output is unspecified;
left padding is tested against bertkit's own float64 model in test_padding_backends.py):
fp32 within 1e-4 (bertkit runs RepaddedSDPA there), and under bf16 autocast (bertkit runs VarlenFlash)
each output within 5e-2 of transformers' fp32 output and no further from it than twice transformers'
own bf16 error + 1e-2. Helpers come from tests/model/test_hf_parity.py, the CPU parity tests."""

from __future__ import annotations

import pytest
import torch

from bertkit.model import MODEL_CLASSES

from .conftest import DEVICE, cuda_or_cpu_check, padded_batch

pytestmark = [pytest.mark.cuda, cuda_or_cpu_check]

PATTERNS = [[1] * 12, [1] * 9 + [0] * 3, [1] + [0] * 4 + [1] * 7, [1] * 3 + [0] * 3 + [1] * 6]
FP32_TOLERANCE, BF16_TOLERANCE = 1e-4, 5e-2


def real_outputs(out, mask: torch.Tensor, fields: list[str]) -> dict[str, torch.Tensor]:
    """Every output field and hidden state, at real positions where it has positions, fp32 on the CPU."""
    values = {}
    for field in fields:
        value = getattr(out, field, None)
        if value is None:
            continue
        if value.dim() >= 2 and value.shape[:2] == mask.shape:
            value = value[mask]  # padded positions are unspecified in transformers
        values[field] = value.float().cpu()
    rows = mask.reshape(-1, mask.shape[-1])  # multiple choice flattens (B, C, T) to (B*C, T)
    for i, hidden in enumerate(out.hidden_states):
        values[f"hidden_states[{i}]"] = hidden[rows].float().cpu()
    return values


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(MODEL_CLASSES))
def test_head_matches_transformers(name, precision, tmp_path):
    import transformers

    from ..model.conftest import tiny_hf_config
    from ..model.test_hf_parity import OUTPUTS, _inputs

    torch.manual_seed(0)
    num_labels = 2 if name == "BertForQuestionAnswering" else 3  # transformers' QA head has num_labels outputs
    reference = getattr(transformers, name)(tiny_hf_config(num_labels=num_labels)).eval()
    reference.save_pretrained(tmp_path)
    ours = MODEL_CLASSES[name].from_pretrained(tmp_path).eval().to(DEVICE)
    reference.to(DEVICE)
    batch = padded_batch(PATTERNS, vocab_size=99)
    inputs, mask = _inputs(name, batch), batch["attention_mask"].bool()
    with torch.no_grad():
        expected = real_outputs(reference(**inputs, output_hidden_states=True), mask, OUTPUTS)
        if precision == "fp32":
            actual = real_outputs(ours(**inputs, output_hidden_states=True), mask, OUTPUTS)
        else:
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                actual = real_outputs(ours(**inputs, output_hidden_states=True), mask, OUTPUTS)
                theirs = real_outputs(reference(**inputs, output_hidden_states=True), mask, OUTPUTS)
    assert actual.keys() == expected.keys() and len(actual) >= 4
    for key, value in actual.items():
        if precision == "fp32":
            torch.testing.assert_close(value, expected[key], atol=FP32_TOLERANCE, rtol=FP32_TOLERANCE, msg=key)
            continue
        torch.testing.assert_close(value, expected[key], atol=BF16_TOLERANCE, rtol=BF16_TOLERANCE, msg=key)
        ours_error = float((value - expected[key]).abs().max())
        their_error = float((theirs[key] - expected[key]).abs().max())
        assert ours_error <= 2 * their_error + 1e-2, \
            f"{key}: bf16 error {ours_error:.3g}, transformers' {their_error:.3g}"
