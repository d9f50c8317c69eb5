"""LoRA on the tiny model: only the adapter trains, is checkpointed and is pushed; the built-in
server serves base + adapter exactly as it serves the merged weights; the ``model.lora.*`` keys
change what they say."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_agents.errors import ConfigError, WeightSyncError
from areal_agents.net import free_port
from areal_agents.serving.adapters import PEFT_PREFIX, adapter_modules, save_adapter_dir
from areal_agents.trainers.algorithms import AlgoConfig
from areal_agents.trainers.config import LoraConfig, ModelConfig, TrainerConfig
from areal_agents.trainers.learner import Learner, LearnerSpec
from areal_agents.trainers.lora import ADAPTER, LoraLayer, apply_lora
from areal_agents.trainers.modeling import load_policy, tiny_model_path
from areal_agents.types import Trajectory

R = 8


@pytest.fixture(scope="module", autouse=True)
def process_group() -> Iterator[None]:
    import torch.distributed as dist

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    if dist.is_initialized():
        dist.destroy_process_group()


@functools.cache
def _port() -> int:
    return free_port()


def learner(
    r: int = R,
    algo: AlgoConfig | None = None,
    seed: int = 0,
    gradient_checkpointing: bool = False,
    **lora: Any,
) -> Learner:
    model = ModelConfig(
        name="tiny", gradient_checkpointing=gradient_checkpointing, lora=LoraConfig(r=r, **lora)
    )
    spec = LearnerSpec(
        model_dir=str(tiny_model_path()),
        algo=algo or AlgoConfig.from_name("grpo"),
        trainer=TrainerConfig(lr=1e-2, groups_per_step=2, seed=seed),
        model=model,
        temperature=1.0,
        rank=0,
        world_size=1,
        max_response_tokens=8,
    )
    out = Learner(spec)
    out.setup("127.0.0.1", _port())
    return out


def batch(seed: int = 0) -> list[Trajectory]:
    """Two groups of two with rewards 1 and 0 (non-zero advantages); behaviour log-probs -1."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for group in ("a", "b"):
        for reward in (1.0, 0.0):
            ids = tuple(int(t) for t in torch.randint(5, 2000, (12,), generator=g))
            mask = (0,) * 4 + (1,) * 8
            rows.append(
                Trajectory(
                    sequence_ids=ids,
                    loss_mask=mask,
                    behavior_logprobs=tuple(-1.0 * m for m in mask),
                    versions=tuple(0 if m else -1 for m in mask),
                    reward=reward,
                    group_id=group,
                )
            )
    return rows


def named(lrn: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lrn.model.named_parameters()}


def logprobs(lrn: Learner, rows: list[Trajectory]) -> torch.Tensor:
    from areal_agents.trainers.batching import collate
    from areal_agents.trainers.forward import token_logprobs

    b = collate(rows, lrn.pad_id)
    with torch.no_grad():
        return token_logprobs(lrn.model, b, 1.0, device=lrn.device, share=False).logprobs


def optimizer_numel(lrn: Learner) -> int:
    return sum(
        t.numel()
        for state in lrn.optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor) and t.ndim > 0
    )


# ---- training --------------------------------------------------------------------------------


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_a_step_changes_only_the_adapter_and_the_optimizer_holds_only_it(
    gradient_checkpointing: bool,
) -> None:
    lrn = learner(gradient_checkpointing=gradient_checkpointing)
    before = named(lrn)
    lp_before = logprobs(lrn, batch())
    lrn.train_step(batch())
    after = named(lrn)
    base = [k for k in before if ".lora_" not in k]
    lora_b = [k for k in before if ".lora_B." in k]
    assert len(lora_b) == 2 * 4  # 2 layers x q, k, v, o
    assert all(torch.equal(before[k], after[k]) for k in base), "a base weight moved"
    assert all(not torch.equal(before[k], after[k]) for k in lora_b), "an adapter did not train"
    assert not torch.allclose(lp_before, logprobs(lrn, batch())), "the policy did not change"
    # the optimizer: exactly the adapter tensors, two moments each
    trainable = sum(p.numel() for p in lrn.model.parameters() if p.requires_grad)
    assert {id(p) for g in lrn.optimizer.param_groups for p in g["params"]} == {
        id(p) for p in lrn.model.parameters() if p.requires_grad
    }
    assert optimizer_numel(lrn) == 2 * trainable
    total = sum(p.numel() for p in lrn.model.parameters())
    assert optimizer_numel(lrn) < 2 * total / 100  # full fine-tuning keeps 2 x total


def test_the_push_payload_is_the_adapter_under_peft_names() -> None:
    lrn = learner()
    lrn.train_step(batch())
    payload = lrn.adapter_state()
    assert len(payload) == 2 * 4 * 2
    assert all(k.startswith(PEFT_PREFIX) and (".lora_A." in k or ".lora_B." in k) for k in payload)
    modules = adapter_modules(payload)
    a, b = modules["model.layers.0.self_attn.q_proj"]
    assert a.shape == (R, 128) and b.shape == (128, R)
    # the exported full state is the base model's names, adapters merged in
    full = lrn.full_state()
    hf = load_policy(tiny_model_path()).state_dict()
    assert set(full) == set(hf)
    w = "model.layers.0.self_attn.q_proj.weight"
    assert torch.allclose(full[w], hf[w] + (b @ a) * lrn.lora.scaling, atol=1e-6)  # type: ignore[union-attr]


def test_kl_reference_is_the_base_with_adapters_off() -> None:
    algo = AlgoConfig.from_name("grpo").replace(kl_coef=0.1)
    lrn = learner(algo=algo)
    assert lrn.ref is None  # no second copy of the model
    lrn.train_step(batch())
    rows = batch(1)
    from areal_agents.trainers.batching import collate, plan

    b = collate(rows, lrn.pad_id)
    pre = lrn._prepass(b, plan(list(range(len(rows))), b.lengths, 1, 0, 512))
    # the adapters are back on, and trainable, after the reference pass
    assert all(p.requires_grad == (".lora_" in n) for n, p in lrn.model.named_parameters())
    base = load_policy(tiny_model_path())
    with torch.no_grad():
        from areal_agents.trainers.batching import sequence_logprobs

        expected = sequence_logprobs(
            base(input_ids=b.sequence_ids, attention_mask=b.attention_mask).logits,
            b.sequence_ids,
            1.0,
        )
    assert pre.ref_logprobs is not None
    assert torch.allclose(pre.ref_logprobs, expected, atol=1e-5)
    assert not torch.allclose(logprobs(lrn, rows), expected, atol=1e-5)  # the policy moved


def test_resume_restores_the_adapter_and_its_optimizer_exactly(tmp_path: Path) -> None:
    first = learner()
    first.train_step(batch(0))
    first.save_checkpoint(str(tmp_path / "ckpt"))
    saved = torch.load(tmp_path / "ckpt" / "learner.pt", weights_only=False)
    assert saved["model"] and all(".lora_" in k for k in saved["model"])  # no base weights
    first.train_step(batch(1))
    expected = named(first)

    resumed = learner(seed=1)  # a different initial adapter: the checkpoint must overwrite it
    assert resumed.load_checkpoint(str(tmp_path / "ckpt")) == 1
    resumed.train_step(batch(1))
    got = named(resumed)
    assert set(got) == set(expected)
    for k in expected:
        assert torch.equal(got[k], expected[k]), k
    with pytest.raises(ConfigError, match=r"resume with the same model\.lora keys"):
        learner(r=4).load_checkpoint(str(tmp_path / "ckpt"))


# ---- the built-in server ---------------------------------------------------------------------


def test_the_builtin_server_serves_base_plus_adapter_like_the_merged_weights() -> None:
    from fastapi.testclient import TestClient

    from areal_agents.serving.api import create_app
    from areal_agents.serving.engine import Engine, GenerationRequest
    from areal_agents.serving.weights import state_dict_to_bytes

    lrn = learner()
    lrn.train_step(batch(0))
    first = lrn.adapter_state()
    lrn.train_step(batch(1))
    second, merged = lrn.adapter_state(), lrn.full_state()
    scaling = lrn.lora.scaling  # type: ignore[union-attr]

    def run(engine: Engine) -> Any:
        request = GenerationRequest(prompt_ids=[1, 42, 7, 99, 300], max_tokens=6, temperature=0.0)
        return engine.submit(request).result(timeout=120)

    adapted, full = Engine(tiny_model_path()), Engine(tiny_model_path())
    try:
        base_out = run(adapted)
        headers = {"content-type": "application/octet-stream"}
        with TestClient(create_app(adapted, "tiny")) as client:
            for version, adapter in ((1, first), (2, second)):  # the second replaces the first
                r = client.post(
                    "/update_weights",
                    params={"version": version, "scaling": scaling},
                    content=state_dict_to_bytes(adapter),
                    headers=headers,
                )
                assert r.status_code == 200, r.text
        full.update_weights(merged, 2)
        a, b = run(adapted), run(full)
        assert a.weight_version == 2
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
        assert a.logprobs != base_out.logprobs  # the adapter changed what is served
        # an adapter of zero deltas brings the base back (replaced, not added)
        zero = {k: torch.zeros_like(v) for k, v in second.items()}
        adapted.update_adapter(zero, scaling, 3)
        assert run(adapted).logprobs == base_out.logprobs
    finally:
        adapted.close()
        full.close()


def test_the_adapter_directory_is_peft_format(tmp_path: Path) -> None:
    import json

    from safetensors.torch import load_file

    lrn = learner()
    out = save_adapter_dir(
        lrn.adapter_state(),
        tmp_path / "a",
        r=R,
        alpha=16.0,
        target_modules=["q_proj", "v_proj"],
        base_model="tiny",
    )
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", R, 16.0)
    assert set(load_file(str(out / "adapter_model.safetensors"))) == set(lrn.adapter_state())


def test_the_pushed_adapter_loads_in_peft_and_gives_the_learners_policy(tmp_path: Path) -> None:
    """What a push sends, written as a directory, is what ``PeftModel.from_pretrained`` reads:
    the loaded model computes the trained learner's log-probs (and its saved names are the
    ones ``save_pretrained`` writes)."""
    import peft
    from safetensors.torch import load_file

    lrn = learner()
    lrn.train_step(batch(0))
    adapter = lrn.adapter_state()
    out = save_adapter_dir(
        adapter,
        tmp_path / "a",
        r=R,
        alpha=lrn.lora.alpha,  # type: ignore[union-attr]
        target_modules=list(lrn.lora.target_modules),  # type: ignore[union-attr]
        base_model=str(tiny_model_path()),  # local: PEFT looks for nothing on a hub
    )
    loaded = peft.PeftModel.from_pretrained(load_policy(tiny_model_path()), str(out)).eval()
    rows = batch(1)
    from areal_agents.trainers.batching import collate, sequence_logprobs

    b = collate(rows, lrn.pad_id)
    with torch.no_grad():
        got = sequence_logprobs(
            loaded(input_ids=b.sequence_ids, attention_mask=b.attention_mask).logits,
            b.sequence_ids,
            1.0,
        )
    assert torch.allclose(got, logprobs(lrn, rows), atol=1e-5)
    saved = tmp_path / "saved"
    loaded.save_pretrained(str(saved), save_embedding_layers=False)
    assert set(load_file(str(saved / "adapter_model.safetensors"))) == set(adapter)


# ---- every model.lora key has an effect ------------------------------------------------------


def _tiny() -> Any:
    torch.manual_seed(0)
    return load_policy(tiny_model_path())


def test_r_alpha_dropout_and_target_modules_do_what_they_say() -> None:
    ids = torch.tensor([[1, 42, 7, 99, 300, 5]])

    def adapted(**kw: Any) -> Any:
        model = _tiny()
        apply_lora(model, LoraConfig(**kw))
        for m in model.modules():
            if isinstance(m, LoraLayer):
                torch.nn.init.normal_(m.lora_B[ADAPTER].weight, std=0.05, generator=None)
        return model

    # r: the adapter's rank
    shapes = {
        n: tuple(p.shape)
        for n, p in adapted(r=4).named_parameters()
        if n.endswith(f"lora_A.{ADAPTER}.weight")
    }
    assert all(s[0] == 4 for s in shapes.values()) and len(shapes) == 8
    # target_modules: which layers get one
    model = adapted(r=4, target_modules=("v_proj",))
    wrapped = [n for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    assert wrapped == ["model.layers.0.self_attn.v_proj", "model.layers.1.self_attn.v_proj"]
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules"):
        apply_lora(_tiny(), LoraConfig(r=4, target_modules=("nope",)))
    # alpha: scales the update (alpha / r)
    torch.manual_seed(1)
    one = adapted(r=4, alpha=4.0)
    torch.manual_seed(1)
    two = adapted(r=4, alpha=8.0)
    base_logits = _tiny()(input_ids=ids).logits
    with torch.no_grad():
        d1 = one(input_ids=ids).logits - base_logits
        d2 = two(input_ids=ids).logits - base_logits
    assert float(d1.abs().max()) > 1e-4
    assert not torch.allclose(d1, d2)
    assert next(m.scaling[ADAPTER] for m in two.modules() if isinstance(m, LoraLayer)) == 2.0
    # dropout: two training forwards differ only with dropout on
    for p, differ in ((0.0, False), (0.5, True)):
        model = adapted(r=4, dropout=p).train()
        with torch.no_grad():
            x, y = model(input_ids=ids).logits, model(input_ids=ids).logits
        assert (not torch.equal(x, y)) == differ, p
    # r=0 is off (the default)
    assert LoraConfig().enabled is False
    with pytest.raises(ConfigError, match=r"model\.lora\.dropout"):
        LoraConfig(r=4, dropout=1.0)
    assert dataclasses.asdict(LoraConfig())["target_modules"] == (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    )


# ---- the trainer's push ----------------------------------------------------------------------


class _AdapterLearners:
    """Learners whose full weights must not be asked for: LoRA pushes send the adapter."""

    def __init__(self, adapter: dict[str, torch.Tensor]) -> None:
        self.adapter = adapter

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return self.adapter

    def export_weights(self, directory: Path) -> None:
        raise AssertionError("a LoRA push wrote the full weights")

    def full_state(self) -> dict[str, torch.Tensor]:
        raise AssertionError("a LoRA push gathered the full weights")


class _AdapterServer:
    base_url = "http://127.0.0.1:1/v1"

    def __init__(self) -> None:
        self.version = 0
        self.pushed: list[tuple[dict[str, torch.Tensor], float]] = []

    def update_adapter(self, adapter: Any, scaling: float, version: int, timeout: float) -> None:
        self.pushed.append((dict(adapter), scaling))
        self.version = version

    def weight_version(self) -> int:
        return self.version


def test_weight_sync_pushes_only_the_adapter_with_its_scaling(tmp_path: Path) -> None:
    from areal_agents.trainers.config import InferenceConfig, TrainConfig
    from areal_agents.trainers.weight_sync import WeightSync

    adapter = learner().adapter_state()
    servers = [_AdapterServer(), _AdapterServer()]
    lora = LoraConfig(r=R, alpha=32.0)
    for weight_sync in ("disk", "state_dict"):
        sync = WeightSync(InferenceConfig(weight_sync=weight_sync), servers, tmp_path, lora=lora)  # type: ignore[arg-type]
        sync.push(_AdapterLearners(adapter), 1 if weight_sync == "disk" else 2)
    assert [s.version for s in servers] == [2, 2]
    for payload, scaling in servers[0].pushed:
        assert set(payload) == set(adapter) and scaling == 32.0 / R
    assert list(tmp_path.iterdir()) == []  # nothing written to disk

    class NoAdapters(_AdapterServer):
        update_adapter = None  # type: ignore[assignment]

    with pytest.raises(WeightSyncError, match="no LoRA adapter push"):
        WeightSync(InferenceConfig(), [NoAdapters()], tmp_path, lora=lora).push(  # type: ignore[list-item]
            _AdapterLearners(adapter), 3
        )
    vllm = InferenceConfig(engine="vllm")  # vLLM serves the adapter by name
    assert TrainConfig(model=ModelConfig(name="tiny", lora=lora), inference=vllm).model.lora.r == R
    too_big = LoraConfig(r=600, alpha=32.0)
    with pytest.raises(ConfigError, match=r"model\.lora\.r=600: vLLM serves .* at most 512"):
        TrainConfig(model=ModelConfig(name="tiny", lora=too_big), inference=vllm)
    assert TrainConfig(model=ModelConfig(name="tiny", lora=too_big)).model.lora.r == 600


def test_vllm_adapter_push_writes_a_peft_directory_and_loads_it_in_place(tmp_path: Path) -> None:
    """The requests only (no vLLM process: the CPU build takes a minute to start)."""
    import json

    from safetensors.torch import load_file

    from areal_agents.serving.vllm import VLLMServer

    adapter = learner().adapter_state()
    server = VLLMServer(str(tiny_model_path()), served_model_name="policy")
    sent: list[tuple[str, str, Any]] = []

    def record(method: str, route: str, timeout: float, **kwargs: Any) -> None:
        if route == "/v1/load_lora_adapter":  # vLLM reads the directory while loading
            path = Path(kwargs["json"]["lora_path"])
            config = json.loads((path / "adapter_config.json").read_text())
            assert (config["r"], config["lora_alpha"]) == (R, 2.0 * R)
            assert config["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
            assert set(load_file(str(path / "adapter_model.safetensors"))) == set(adapter)
        sent.append((method, route, kwargs.get("json")))

    server._request = record  # type: ignore[method-assign]
    for version in (1, 2):
        server.update_adapter(adapter, 2.0, version)
    # in-flight requests are aborted (and continued by the clients) around each swap
    routes = ["/pause", "/v1/load_lora_adapter", "/update_weight_version", "/resume"]
    assert [r for _, r, _ in sent] == routes * 2
    load = sent[5][2]
    assert load["lora_name"] == "policy-lora" and load["load_inplace"] is True
    assert Path(load["lora_path"]).name == "v000002"
    assert sent[6][2] == {"new_version": "2"}
    assert server._version == 2
    assert Path(sent[1][2]["lora_path"]).exists()  # the previous adapter is kept, ...
    server.update_adapter(adapter, 2.0, 3)
    assert not Path(sent[1][2]["lora_path"]).exists()  # ... older ones are not
    assert sorted(p.name for p in Path(load["lora_path"]).parent.iterdir()) == [
        "v000002",
        "v000003",
    ]
    with pytest.raises(WeightSyncError, match="must increase"):
        server.update_adapter(adapter, 2.0, 3)
    server.stop()
