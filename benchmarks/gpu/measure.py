"""What the lent GPU machine can measure with torch, transformers and peft alone (no ray, vLLM,
gymnasium or openai there), in a few minutes:

1. **Learner step** — the same GRPO batch trained by plain single-process torch and by the
   project's FSDP2 :class:`~areal_agents.trainers.learner.Learner` with 1 rank (NCCL on CUDA,
   gloo on CPU): seconds per step, microseconds per trained token, the FSDP/plain ratio; at two
   batch sizes, so that a step's fixed and per-token costs separate (the simulator's
   ``learner.step_s`` and ``learner.token_s``).
2. **Decode throughput** — the built-in engine's tokens/s against the number of concurrent
   generations (the simulator's ``server.concurrency`` / ``server.tokens_per_s``), and the time
   an in-process weight update takes (``push_s``, a lower bound: no HTTP, no other process).
3. **Log-prob agreement** — the engine samples in ``--dtype`` (bf16 by default); the learner
   (FSDP2, same dtype) recomputes the log-probs of those tokens. Printed: the mean and largest
   absolute difference and the spread of the importance ratio ``exp(learner - engine)``, which
   off-policy corrections divide by.

Writes a JSON result (``--json``) and a simulator profile (``--profile``, the format of
``areal_agents/simulation/profiles``; the episode section is the CPU workload's, so runs on the
two machines compare on the same workload).

    python benchmarks/gpu/measure.py --device cuda --json benchmarks/results/gpu_measure.json \
        --profile areal_agents/simulation/profiles/gpu_builtin_measured.yaml
    python benchmarks/gpu/measure.py --device cpu --quick --synthetic-layers 2 \
        --synthetic-hidden 64     # a smoke test on a CPU

``--model synthetic`` (the default) measures a random model of SmolLM2-135M's shape that the
script builds itself, so that no model has to travel to the GPU machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _common import machine_info, write_json  # noqa: E402
from learner import synthetic_batch  # noqa: E402

__all__ = ["main"]


SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
}
"""SmolLM2-135M's shape (the project's default model), for ``--model synthetic``."""


def synthetic_model(target: Path, hidden: int, layers: int, vocab: int = 49152) -> str:
    """A random Llama of SmolLM2-135M's shape (``hidden``/``layers`` shrink it) with a
    word-level tokenizer over ``vocab`` ids, saved under ``target``: speed and agreement need
    the shape, not trained weights, and nothing has to travel to the GPU machine."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (target / "config.json").is_file():
        return str(target)
    scale = hidden / SMOLLM2_135M["hidden_size"]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=max(8, int(SMOLLM2_135M["intermediate_size"] * scale)),
        num_hidden_layers=layers,
        num_attention_heads=max(1, int(SMOLLM2_135M["num_attention_heads"] * scale)),
        num_key_value_heads=max(1, int(SMOLLM2_135M["num_key_value_heads"] * scale)),
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, bos_token="t1", eos_token="t2", pad_token="t0", unk_token="t0"
    )
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return str(target)


def trl_stand_in() -> bool:
    """Without trl (the GPU machine has torch, transformers and peft only), put plain-torch
    versions of the three functions the learner takes from ``trl.trainer.utils`` in its place.
    They compute the same thing (``log_softmax`` then gather; entropy) without trl's fused
    Triton kernel. Returns True when the stand-in is in use."""
    try:
        import trl.trainer.utils
    except ImportError:
        pass
    else:
        return False
    import types

    import torch
    import torch.nn.functional as F

    def selective_log_softmax(
        logits: Any, index: Any, temperature: float = 1.0, row_mask: Any = None
    ) -> Any:
        if temperature != 1.0:
            logits = logits / temperature
        out = torch.gather(logits.log_softmax(-1), -1, index.unsqueeze(-1)).squeeze(-1)
        return out if row_mask is None else out.masked_fill(row_mask == 0, 0.0)

    def entropy_from_logits(logits: Any, chunk_size: int = 128) -> Any:
        flat = logits.reshape(-1, logits.shape[-1])
        parts = []
        for chunk in flat.split(chunk_size, dim=0):
            logps = F.log_softmax(chunk, dim=-1)
            parts.append(-(logps.exp() * logps).sum(-1))
        return torch.cat(parts).reshape(logits.shape[:-1])

    def selective_log_softmax_and_entropy(
        logits: Any,
        index: Any,
        entropy_requires_grad: bool = True,
        temperature: float = 1.0,
        row_mask: Any = None,
    ) -> tuple[Any, Any]:
        if temperature != 1.0:
            logits = logits / temperature
        logprobs = selective_log_softmax(logits, index, row_mask=row_mask)
        with torch.set_grad_enabled(entropy_requires_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits)
        if row_mask is not None:
            entropy = entropy.masked_fill(row_mask == 0, 0.0)
        return logprobs, entropy

    utils = types.ModuleType("trl.trainer.utils")
    utils.selective_log_softmax = selective_log_softmax  # type: ignore[attr-defined]
    utils.entropy_from_logits = entropy_from_logits  # type: ignore[attr-defined]
    utils.selective_log_softmax_and_entropy = selective_log_softmax_and_entropy  # type: ignore[attr-defined]
    trainer = types.ModuleType("trl.trainer")
    trainer.utils = utils  # type: ignore[attr-defined]
    trl = types.ModuleType("trl")
    trl.trainer = trainer  # type: ignore[attr-defined]
    sys.modules.update({"trl": trl, "trl.trainer": trainer, "trl.trainer.utils": utils})
    return True


def _model_dir(name: str, args: Any) -> str:
    if name == "synthetic":
        where = Path(args.work) / f"synthetic-h{args.synthetic_hidden}-l{args.synthetic_layers}"
        return synthetic_model(where, args.synthetic_hidden, args.synthetic_layers)
    if name == "tiny":
        from areal_agents.trainers.modeling import tiny_model_path

        return str(tiny_model_path())
    from areal_agents.serving.model import resolve_model

    return str(resolve_model(name))


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def plain_steps(
    model_dir: str, batch: list[Any], steps: int, dtype: str, device: Any
) -> list[float]:
    """Plain torch: the learner's loss and optimizer on one device, no process group."""
    import torch

    from areal_agents.trainers.algorithms import AlgoConfig, compute_advantages, compute_policy_loss
    from areal_agents.trainers.batching import collate, sequence_logprobs
    from areal_agents.trainers.modeling import load_policy

    model = load_policy(Path(model_dir), dtype).to(device)
    algo = AlgoConfig.from_name("grpo")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    data = collate(batch, int(getattr(model.config, "pad_token_id", None) or 0))
    adv, _ = compute_advantages(algo, data.rewards, data.loss_mask, data.group_ids)
    norm = float((data.loss_mask.sum(1) > 0).sum())
    times = []
    for _ in range(steps + 1):  # the first step warms up allocators and kernels
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ids = data.sequence_ids.to(device)
        logits = model(input_ids=ids, attention_mask=data.attention_mask.to(device)).logits
        lp = sequence_logprobs(logits, ids, 1.0)
        w = data.loss_mask.shape[1]
        lp = torch.nn.functional.pad(lp, (0, w - lp.shape[1]))
        loss, _ = compute_policy_loss(
            algo,
            lp,
            lp.detach(),
            data.behavior_logprobs.to(device),
            adv[:, :w].to(device),
            data.loss_mask.to(device),
            normalizer=norm,
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    del model, opt
    return times[1:]


def make_learner(model_dir: str, dtype: str, device: Any, micro_batch_tokens: int) -> Any:
    """The project's FSDP2 learner with one rank (NCCL on CUDA, gloo on CPU)."""
    from areal_agents.net import free_port
    from areal_agents.trainers.algorithms import AlgoConfig
    from areal_agents.trainers.config import ModelConfig, TrainerConfig
    from areal_agents.trainers.learner import Learner, LearnerSpec

    trainer = TrainerConfig(lr=1e-6, groups_per_step=1, micro_batch_tokens=micro_batch_tokens)
    spec = LearnerSpec(
        model_dir=model_dir,
        algo=AlgoConfig.from_name("grpo"),
        trainer=trainer,
        model=ModelConfig(name=model_dir, dtype=dtype),
        temperature=1.0,
        rank=0,
        world_size=1,
        use_gpu=device.type == "cuda",
    )
    learner = Learner(spec)
    learner.setup("127.0.0.1", free_port())
    return learner


def fsdp_steps(learner: Any, batch: list[Any], steps: int, device: Any) -> list[float]:
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        learner.train_step(batch)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times[1:]


def decode_curve(
    engine: Any, batch_sizes: list[int], prompt_len: int, new_tokens: int
) -> dict[str, Any]:
    """Tokens/s of ``b`` concurrent generations of ``new_tokens`` each, for each ``b``."""
    from areal_agents.serving.engine import GenerationRequest

    def run(b: int) -> tuple[int, float]:
        requests = [
            GenerationRequest(
                prompt_ids=[(7 * i + j) % 500 + 10 for j in range(prompt_len)],
                max_tokens=new_tokens,
                ignore_eos=True,
                seed=i,
            )
            for i in range(b)
        ]
        t0 = time.perf_counter()
        futures = [engine.submit(r) for r in requests]
        tokens = sum(len(f.result(timeout=600).token_ids) for f in futures)
        return tokens, time.perf_counter() - t0

    run(min(batch_sizes))  # warm-up
    rates = []
    for b in batch_sizes:
        tokens, seconds = run(b)
        rates.append(round(tokens / seconds, 2))
        print(f"  decode: {b:4d} concurrent -> {rates[-1]:10.1f} tokens/s", flush=True)
    return {"concurrency": batch_sizes, "tokens_per_s": rates, "new_tokens": new_tokens}


def logprob_agreement(
    engine: Any, learner: Any, rows: int, prompt_len: int, new_tokens: int
) -> dict[str, Any]:
    """The engine's log-probs of its own samples against the learner's recomputation."""
    import torch

    from areal_agents.serving.engine import GenerationRequest
    from areal_agents.trainers.batching import collate
    from areal_agents.trainers.forward import token_logprobs
    from areal_agents.types import Trajectory

    trajectories, engine_lps = [], []
    for i in range(rows):
        prompt = [(13 * i + j) % 500 + 10 for j in range(prompt_len)]
        request = GenerationRequest(prompt_ids=prompt, max_tokens=new_tokens, seed=100 + i)
        result = engine.submit(request).result(timeout=600)
        ids = [*prompt, *result.token_ids]
        mask = [0] * len(prompt) + [1] * len(result.token_ids)
        trajectories.append(
            Trajectory(
                sequence_ids=tuple(ids),
                loss_mask=tuple(mask),
                behavior_logprobs=tuple([0.0] * len(prompt) + list(result.logprobs)),
                versions=tuple(0 if m else -1 for m in mask),
                reward=0.0,
                group_id=f"g{i}",
                task_id=f"t{i}",
            )
        )
        engine_lps.append(list(result.logprobs))
    data = collate(trajectories, learner.pad_id)
    with torch.no_grad():
        lp = (
            token_logprobs(  # the learner's own forward, packed as its config says
                learner.model,
                data,
                1.0,
                device=learner.device,
                share=learner.spec.trainer.share_prompt_prefix,
            )
            .logprobs.float()
            .cpu()
        )
    diffs = []
    for i, row in enumerate(engine_lps):
        start = prompt_len - 1  # position t holds log p(token t+1)
        mine = lp[i, start : start + len(row)].tolist()
        diffs.extend(a - b for a, b in zip(mine, row, strict=True))
    ratios = [float(torch.tensor(d).exp()) for d in diffs]
    return {
        "tokens": len(diffs),
        "mean_abs_diff": round(statistics.fmean(abs(d) for d in diffs), 5),
        "max_abs_diff": round(max(abs(d) for d in diffs), 5),
        "ratio_min": round(min(ratios), 4),
        "ratio_max": round(max(ratios), 4),
        "ratio_std": round(statistics.pstdev(ratios), 5),
    }


def _profile(result: dict[str, Any]) -> str:
    """A simulator profile (the YAML format of areal_agents/simulation/profiles)."""
    import yaml

    base = HERE.parents[1] / "areal_agents" / "simulation" / "profiles" / "cpu_2core_builtin.yaml"
    episode = yaml.safe_load(base.read_text())["episode"]
    learner, decode = result["learner"], result["decode"]
    profile = {
        "name": f"gpu_builtin_{result['machine'].get('cuda') or 'cpu'}".replace(" ", "_").lower(),
        "description": (
            f"Measured by benchmarks/gpu/measure.py on {result['machine'].get('cuda') or 'CPU'}: "
            f"built-in engine ({result['dtype']}), FSDP2 learner with 1 rank, model "
            f"{Path(result['model']).name}; episode section from cpu_2core_builtin.yaml."
        ),
        "server": {
            "concurrency": decode["concurrency"],
            "tokens_per_s": decode["tokens_per_s"],
            "efficiency": 1.0,
            "while_training": 1.0,
        },
        "episode": episode,
        "learner": {
            "step_s": learner["fit_step_s"],
            "token_s": learner["fit_token_s"],
            "scaling_efficiency": 0.9,
        },
        "push_s": result["push_s"],
        "push_pauses_generation": True,
        "sources": {"all": "benchmarks/gpu/measure.py (its --json output)"},
    }
    return yaml.safe_dump(profile, sort_keys=False)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument(
        "--model",
        default="synthetic",
        help="synthetic (random weights, SmolLM2-135M's shape), default, tiny, or an HF directory",
    )
    p.add_argument("--synthetic-hidden", type=int, default=SMOLLM2_135M["hidden_size"])
    p.add_argument("--synthetic-layers", type=int, default=SMOLLM2_135M["num_hidden_layers"])
    p.add_argument("--work", default="runs/gpu", help="where a synthetic model is saved")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rows", type=int, default=32, help="learner batch rows (and half of it)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch-sizes", default="1,4,16,64,128")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--agreement-rows", type=int, default=16)
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    p.add_argument("--json", default=None)
    p.add_argument("--profile", default=None, help="write a simulator profile here")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.seq_len, args.steps = 4, 32, 1
        args.batch_sizes, args.new_tokens, args.agreement_rows = "1,2", 4, 2

    import torch

    from areal_agents.serving.engine import Engine

    stand_in = trl_stand_in()
    if stand_in:
        print("trl is not installed: the learner's log-softmax is plain torch here", flush=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU visible")
    device = torch.device(args.device)
    model_dir = _model_dir(args.model, args)
    result: dict[str, Any] = {
        "machine": machine_info(),
        "device": args.device,
        "model": model_dir,
        "dtype": args.dtype,
        "trl": "plain-torch stand-in" if stand_in else "trl",
    }
    t_start = time.perf_counter()

    print(f"1. learner step ({args.device}, {args.dtype})", flush=True)
    learner = make_learner(model_dir, args.dtype, device, micro_batch_tokens=args.seq_len * 8)
    vocab = int(learner.config.vocab_size)
    sizes = sorted({max(2, args.rows // 2), args.rows})
    runs = []
    for rows in sizes:
        batch = synthetic_batch(rows, args.seq_len, vocab)
        tokens = sum(t.num_policy_tokens for t in batch)
        plain = statistics.median(plain_steps(model_dir, batch, args.steps, args.dtype, device))
        fsdp = statistics.median(fsdp_steps(learner, batch, args.steps, device))
        runs.append({"rows": rows, "trained_tokens": tokens, "plain_s": plain, "fsdp1_s": fsdp})
        print(
            f"  {rows:4d} rows, {tokens:6d} tokens: plain {plain:.3f} s, fsdp1 {fsdp:.3f} s "
            f"({fsdp / plain:.2f}x), {1e6 * fsdp / tokens:.1f} us/token",
            flush=True,
        )
    if len(runs) == 2 and runs[1]["trained_tokens"] != runs[0]["trained_tokens"]:
        a, b = runs
        token_s = (b["fsdp1_s"] - a["fsdp1_s"]) / (b["trained_tokens"] - a["trained_tokens"])
        token_s = max(token_s, 0.0)
        step_s = max(b["fsdp1_s"] - token_s * b["trained_tokens"], 0.0)
    else:
        token_s, step_s = runs[-1]["fsdp1_s"] / runs[-1]["trained_tokens"], 0.0
    result["learner"] = {"runs": runs, "fit_step_s": round(step_s, 5), "fit_token_s": token_s}

    print(f"2. built-in engine decode ({args.device}, {args.dtype})", flush=True)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    engine = Engine(
        model_dir,
        device=args.device,
        dtype=args.dtype,
        max_model_len=max(2048, args.seq_len + args.new_tokens + 64),
        max_batch_size=max(batch_sizes),
    )
    try:
        result["decode"] = decode_curve(engine, batch_sizes, 64, args.new_tokens)
        state = {k: v.detach().to("cpu") for k, v in learner.full_state().items()}
        t0 = time.perf_counter()
        engine.update_weights(state, engine.weight_version + 1)
        result["push_s"] = round(time.perf_counter() - t0, 4)
        print(f"  in-process weight update: {result['push_s']} s", flush=True)
        print("3. log-prob agreement (engine samples, learner recomputes)", flush=True)
        agreement = logprob_agreement(
            engine, learner, args.agreement_rows, 32, max(args.new_tokens, 8)
        )
    finally:
        engine.close()
        learner.shutdown()
    result["logprob_agreement"] = agreement
    print(f"  {agreement}", flush=True)
    result["total_s"] = round(time.perf_counter() - t_start, 1)
    print(f"total {result['total_s']} s", flush=True)
    write_json(args.json, result)
    if args.profile:
        try:
            Path(args.profile).write_text(_profile(result))
        except ImportError as e:  # PyYAML missing there: the JSON has every figure
            print(f"no simulator profile written ({e}); see --json", flush=True)
    return result


if __name__ == "__main__":
    main()
