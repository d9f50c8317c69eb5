"""Weight updates on a serving engine, through the clients: the built-in server and real vLLM
(``vllm`` marker), each started once for this module (the ``server`` fixture of ``conftest.py``).

A new checkpoint changes what the server generates and the version its responses carry, and an
update that lands mid-generation is continued under the new weights, each token tagged with the
version that generated it.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import openai
import pytest
import torch

from areal_agents.errors import WeightSyncError
from areal_agents.policies.token_client import TokenPolicy
from areal_agents.types import Message, Turn
from tests.policies.test_clients import _greedy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def noisy_dir(model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A checkpoint of the default model with noise on its MLP weights (same shapes)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(model_dir / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    noisy = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen) if ".mlp." in k else v
        for k, v in state.items()
    }
    path = tmp_path_factory.mktemp("noisy")
    save_file(noisy, str(path / "model.safetensors"))
    return path


def _noisy_state(noisy_dir: Any) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(noisy_dir / "model.safetensors"))


def test_weight_updates_change_outputs_and_versions(
    client: openai.OpenAI, server: Any, model_dir: Any, noisy_dir: Any, tokenizer: Any
) -> None:
    prompt = tokenizer.encode("The capital of France is", add_special_tokens=False)
    before = _greedy(client, server, prompt, n=8).choices[0].model_extra["token_ids"]  # type: ignore[index]
    start = server.weight_version()
    server.update_weights_from_state_dict(_noisy_state(noisy_dir), start + 1, timeout=300)
    assert server.weight_version() == start + 1
    changed = _greedy(client, server, prompt, n=8)
    assert changed.choices[0].model_extra["token_ids"] != before  # type: ignore[index]
    if server.kind == "builtin":
        assert (changed.model_extra or {})["weight_version"] == start + 1
    with pytest.raises(WeightSyncError, match="version must increase"):
        server.update_weights_from_disk(str(model_dir), start + 1, timeout=60)
    bad = {"model.embed_tokens.weight": torch.zeros(10, 576)}
    with pytest.raises(WeightSyncError, match="shape"):
        server.update_weights_from_state_dict(bad, start + 5, timeout=60)
    server.update_weights_from_disk(str(model_dir), start + 2, timeout=300)  # the original
    assert server.weight_version() == start + 2
    restored = _greedy(client, server, prompt, n=8).choices[0].model_extra["token_ids"]  # type: ignore[index]
    assert restored == before


def _tokens_generated(server: Any) -> int:
    """The server's count of generated tokens (decode steps on the built-in server)."""
    import httpx

    if server.kind == "builtin":
        return int(httpx.get(f"{server.root_url}/weight_version").json()["decode_steps"])
    metrics = httpx.get(f"{server.root_url}/metrics").text
    values = re.findall(r"^vllm:generation_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)$", metrics, re.M)
    assert values, "vLLM exports no vllm:generation_tokens_total metric"
    return int(sum(float(v) for v in values))


async def _settled_token_count(server: Any) -> int:
    """The token count once it stops moving: vLLM records a finished request's last tokens in
    its metrics after the response, and a late count would pass for the next request's tokens
    (the update then lands before that request reaches the engine, and its tokens keep the old,
    conservative version tag)."""
    count = _tokens_generated(server)
    for _ in range(50):
        await asyncio.sleep(0.2)
        count, previous = _tokens_generated(server), count
        if count == previous:
            break
    return count


def test_an_update_mid_generation_is_continued_under_new_weights(
    server: Any, model_dir: Any, noisy_dir: Any, tokenizer: Any
) -> None:
    length = 400

    async def scenario() -> tuple[Turn, bool]:
        policy = TokenPolicy(
            server.base_url,
            server.served_model_name,
            tokenizer,
            temperature=0.0,
            max_tokens=length,
            extra_body={"ignore_eos": True},
            version_source=lambda: -1,  # unused: both servers send the version with responses
        )
        start, version = await _settled_token_count(server), server.weight_version()
        task = asyncio.create_task(policy.act([Message.user("Count to one hundred.")], []))
        # the generation is under way: more tokens than a late-counted earlier request could add
        while _tokens_generated(server) < start + 40:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(server.update_weights_from_disk, str(noisy_dir), version + 1, 300)
        # the update stops generation until the new weights serve: fewer tokens than the turn's
        # when it returns means it landed mid-turn (on a loaded machine the polls above can lag
        # until the turn has ended, and then there is no mid-turn update to check)
        mid_turn = _tokens_generated(server) < start + length
        turn = await task
        await asyncio.to_thread(server.update_weights_from_disk, str(model_dir), version + 2, 300)
        return turn, mid_turn

    for _ in range(3):
        turn, mid_turn = asyncio.run(scenario())
        assert len(turn.completion_ids or ()) == length and turn.finish_reason == "length"
        if mid_turn:
            break
    assert mid_turn, "the update never landed before the turn ended (3 tries)"
    versions = list(turn.versions or ())
    old, new = versions[0], versions[-1]
    assert new == old + 1  # the update landed mid-turn...
    switch = versions.index(new)
    assert 0 < switch < length and versions == [old] * switch + [new] * (length - switch)  # once
