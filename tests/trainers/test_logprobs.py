"""Log-probs and entropies from logits (TRL kernels) and their alignment with the token ids."""

from __future__ import annotations

import pytest
import torch
import transformers

from areal_agents.trainers.batching import (
    entropy_from_logits,
    gather_logprobs,
    logprobs_and_entropy,
    sequence_logprobs,
)

D = torch.float64


def test_gather_and_entropy_match_the_naive_formulas() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g, dtype=D) * 3
    tokens = torch.randint(0, 11, (3, 5), generator=g)
    for temp in (1.0, 0.7):
        logp = torch.log_softmax(logits / temp, dim=-1)
        naive_lp = logp.gather(-1, tokens[..., None])[..., 0]
        naive_ent = -(logp.exp() * logp).sum(-1)
        torch.testing.assert_close(gather_logprobs(logits, tokens, temp), naive_lp)
        torch.testing.assert_close(entropy_from_logits(logits, temp), naive_ent)
        lp, ent = logprobs_and_entropy(logits, tokens, temp)
        torch.testing.assert_close(lp, naive_lp)
        torch.testing.assert_close(ent, naive_ent)
    # the uniform distribution over 11 tokens: log(1/11) and entropy log(11)
    flat = torch.zeros(1, 1, 11, dtype=D)
    assert gather_logprobs(flat, torch.tensor([[4]])).item() == pytest.approx(
        -torch.log(torch.tensor(11.0)).item()
    )
    assert entropy_from_logits(flat).item() == pytest.approx(torch.log(torch.tensor(11.0)).item())
    with pytest.raises(ValueError, match="temperature"):
        gather_logprobs(logits, tokens, temperature=0.0)


def test_gradients_flow_and_entropy_can_be_detached() -> None:
    logits = torch.randn(2, 4, 7, requires_grad=True)
    tokens = torch.randint(0, 7, (2, 4))
    lp, ent = logprobs_and_entropy(logits, tokens, entropy_grad=False)
    assert lp.requires_grad and not ent.requires_grad
    lp.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_sequence_logprobs_line_up_with_the_predicted_tokens() -> None:
    """Position t holds log p(ids[t + 1] | ids[:t + 1]), checked against prefix forward passes."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        logits = model(ids).logits.double()
        lp = sequence_logprobs(logits, ids, temperature=0.8)
        assert lp.shape == (2, 5)
        for t in range(5):
            prefix = model(ids[:, : t + 1]).logits[:, -1].double() / 0.8  # predicts ids[:, t + 1]
            logp = torch.log_softmax(prefix, -1)
            torch.testing.assert_close(
                lp[:, t], logp.gather(-1, ids[:, t + 1 : t + 2])[:, 0], atol=1e-5, rtol=0
            )
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        sequence_logprobs(logits[0], ids)
