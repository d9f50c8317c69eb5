"""The training loop, top to bottom: generation and learning overlap; staleness stays bounded.

Rollout workers (Ray actors) keep generating in the background: they take tasks from the
buffer, which admits work only while it can still be trained within ``max_staleness`` versions.
The driver loop below repeats::

    batch   = complete groups from the buffer, oldest first   (generation happened meanwhile)
    metrics = learners.train_step(batch)                      (advantages, loss, optimizer step)
    push weights version `step` to every inference server     (in-flight episodes continue)
    record metrics, transcripts; checkpoint every N steps

``trainer.mode=sync`` is the same loop with staleness 0: nothing is admitted while the learner
works, so generation and learning alternate. The run ends after ``trainer.total_steps``, or
earlier once ``trainer.time_budget_s`` of training time is spent: a step starts only while the
time left covers the longest step so far, so that the run ends within its budget;
either way the last step is checkpointed and ``summary.json`` gives the ``stop_reason``. On the
way a checkpoint is saved every ``trainer.checkpoint_interval_s`` seconds (and every
``trainer.checkpoint_every`` steps if set), and on SIGTERM/SIGINT after the current step.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from pathlib import Path
from typing import Any

import ray
from tqdm import tqdm

from areal_agents.cpus import check_cpus
from areal_agents.envs.registry import make_env
from areal_agents.errors import AgentsError
from areal_agents.files import read_json, write_json
from areal_agents.trainers.buffer import Group, TrajectoryBuffer
from areal_agents.trainers.checkpoint import CheckpointManager, load_rng, save_rng
from areal_agents.trainers.cluster import spread
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.held_out import (
    closing_screen,
    disk_mb,
    evaluate,
    held_out_before,
    held_out_task_ids,
)
from areal_agents.trainers.inference import (
    launch_local_servers,
    server_torch_threads,
    start_servers,
    stop_servers,
)
from areal_agents.trainers.learner_group import LearnerGroup
from areal_agents.trainers.lora import serving_setup
from areal_agents.trainers.metrics import (
    MetricsLogger,
    health_metrics,
    progress_postfix,
    write_summary,
)
from areal_agents.trainers.modeling import model_source, prepare_model_dir
from areal_agents.trainers.report import refresh_report
from areal_agents.trainers.runtime import (
    RolloutWorkerActor,
    choose_run_dir,
    remote_class,
    save_config,
    start_ray,
    stop_ray,
    stop_workers,
    worker_env,
)
from areal_agents.trainers.step_records import (
    print_summary,
    sample_transcripts,
    step_metrics,
    waiting_postfix,
    write_transcript_viewer,
)
from areal_agents.trainers.stop import (
    GracefulStop,
    StartupClock,
    latest_step_start,
    over,
    rl_budget_s,
)
from areal_agents.trainers.warm_start import lean_finished_run, run_warm_start, warm_start_info
from areal_agents.trainers.weight_sync import WeightSync

__all__ = ["train"]

logger = logging.getLogger(__name__)


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run (or resume) the training described by ``cfg``; returns the run summary."""
    clock = StartupClock()
    run_dir, resume_from = choose_run_dir(cfg)
    check_env(cfg)
    held_out = held_out_task_ids(cfg)  # never trained on; scored before and after
    model_dir = prepare_model_dir(cfg.model, run_dir)  # the chat-template gate: before Ray
    # what other nodes get: the model's own directory and the template, never the run directory
    shared_dir, template = model_source(model_dir) if cfg.ray.address else (model_dir, None)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir)
    # the servers' config and the model the clients name (with LoRA on vLLM: the adapter)
    serving, client_model = serving_setup(cfg, model_dir, run_dir)
    ckpt = CheckpointManager(run_dir / "checkpoints", keep=cfg.trainer.keep_checkpoints)
    ckpt.clean_partial()
    print(f"run directory: {run_dir}" + (f" (resuming {resume_from.name})" if resume_from else ""))

    clock.mark("prepare_s")  # the environment built once, the model directory, the template
    # Before ray.init a signal unwinds at once (closing what started); ray.init installs its own
    # SIGTERM handler, so the stop handler is installed again after it. In the loop either
    # signal stops after the current step with a checkpoint.
    stop = GracefulStop()
    stop.install()
    servers: list[Any] = []
    learners: LearnerGroup | None = None
    workers: list[Any] = []
    runs: list[Any] = []
    sync: WeightSync | None = None
    started_ray = False
    try:
        if not cfg.ray.address:  # local servers load the model while Ray starts
            os.environ.update({k: v for k, v in worker_env().items() if k not in os.environ})
            servers = launch_local_servers(serving, model_dir, "policy", run_dir / "logs")
        # a fresh run's supervised warm start (while the servers load the base model): the
        # learners start from it; a resumed run's checkpoint holds every weight anyway
        warm = run_warm_start(cfg, model_dir, run_dir, held_out) if resume_from is None else None
        learner_dir = run_dir / "warm_start" if warm else shared_dir  # weights only: no template
        clock.mark("warm_start_s")
        started_ray = start_ray(cfg.ray)
        stop.install()
        clock.mark("ray_s")
        # ---- set-up: learners (loading meanwhile), servers, buffer; restore the checkpoint --
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learners") as pool:
            building = pool.submit(LearnerGroup, cfg, learner_dir)
            servers = start_servers(
                serving,
                shared_dir,
                "policy",
                on_cluster=bool(cfg.ray.address),
                log_dir=run_dir / "logs",
                launched=servers,
                chat_template=template,
            )
            clock.mark("servers_s")
            buffer = (
                remote_class(TrajectoryBuffer).options(num_cpus=0).remote(**buffer_options(cfg))
            )
            base = None
            if warm:  # the base model first, then servers on the warm-started one (version 0)
                base = held_out_before(cfg, servers, run_dir, client_model, fresh=True, name="base")
                clock.mark("eval_base_s")
                stop_servers(servers)
                servers = []
                servers = start_servers(
                    serving,
                    learner_dir,
                    "policy",
                    on_cluster=bool(cfg.ray.address),
                    log_dir=run_dir / "logs",
                )
                clock.mark("servers_warm_s")
            elif resume_from is not None:
                base = held_out_before(
                    cfg, servers, run_dir, client_model, fresh=False, name="base"
                )
            before = held_out_before(cfg, servers, run_dir, client_model, fresh=resume_from is None)
            clock.mark("eval_before_s")

            def start_rollouts() -> tuple[list[Any], list[Any]]:
                """The rollout workers on the servers in use, each already running."""
                started = start_workers(
                    cfg,
                    servers,
                    shared_dir,
                    buffer,
                    held_out or frozenset(),
                    template,
                    model=client_model,
                )
                return started, [w.run.remote() for w in started]

            if resume_from is None:  # a fresh run: the first rollouts overlap the learners' load
                workers, runs = start_rollouts()
            learners = building.result()
        clock.mark("learners_s")  # the part of the learners' load that servers did not overlap
        threads = {
            "learner": learners.info["torch_threads"],
            "servers": server_torch_threads(servers),
        }
        sync = make_sync(cfg, servers, run_dir)
        step, elapsed_before = 0, 0.0
        if resume_from is not None:
            step = learners.load_checkpoint(resume_from / "learner")
            ray.get(buffer.load_state_dict.remote(state=read_json(resume_from / "buffer.json")))
            load_rng(resume_from / "rng.pkl")
            elapsed_before = float(read_json(resume_from / "trainer.json")["elapsed_s"])
            sync.push(learners, step)  # the servers start from the base weights
            ray.get(buffer.set_version.remote(version=step))
            # ---- rollout workers generate in the background from here on -----------------
            workers, runs = start_rollouts()
        log = MetricsLogger(run_dir, cfg.log, resume_step=step)

        start = time.perf_counter() - elapsed_before
        bar = tqdm(
            total=cfg.trainer.total_steps,
            initial=step,
            disable=not cfg.log.progress,
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )
        last_ckpt, last_ckpt_at = step, time.perf_counter()
        budget = cfg.trainer.time_budget_s
        warm = warm_start_info(run_dir)  # what the run's warm start did (None: it had none)
        warm_s = float((warm or {}).get("train_s") or 0.0)
        rl_budget = rl_budget_s(budget, warm_s)
        deadline = None if rl_budget is None else start + rl_budget
        stop_reason = "total_steps"
        stats = ray.get(buffer.stats.remote())  # dropped episodes are counted from here on

        def served(version: int) -> None:  # every server generates with ``version`` now
            ray.get(buffer.set_version.remote(version=version))

        stop.arm()
        first_step = step
        longest_step_s = 0.0
        while step < cfg.trainer.total_steps:
            t0 = time.perf_counter()
            last_start = latest_step_start(deadline, longest_step_s)
            groups = None if stop.requested else wait_for_batch(buffer, runs, bar, last_start, stop)
            if groups is None:  # a signal, or too little of the time budget left for a step
                stop_reason = stop.name or "time_budget"
                break
            t1 = time.perf_counter()
            if step == first_step:
                clock.mark("first_batch_s")
            trajectories = [t for g in groups for t in g.trajectories]
            learn = learners.train_step(trajectories)
            t2 = time.perf_counter()
            if step == first_step:
                clock.mark("first_train_s")
                clock.first_step_done()
            step += 1
            sync_s = sync.push_step(  # the servers may still be loading it: see on_served
                learners, step, overlap=cfg.trainer.overlap_weight_push, on_served=served
            )

            stats_before, stats = stats, ray.get(buffer.stats.remote())
            times = {
                "wait_s": t1 - t0,
                "train_s": t2 - t1,
                "sync_s": sync_s,
                "push_s": sync.last_push_s,  # the last push served, start to end
                "step_s": time.perf_counter() - t0,
                "elapsed_s": time.perf_counter() - start,
            }
            longest_step_s = max(longest_step_s, times["step_s"])
            metrics = step_metrics(step, groups, learn, stats, times)
            metrics["server/weight_version"] = min(sync.served_versions)
            metrics.update(health_metrics(trajectories, stats_before, stats))
            log.log(step, metrics)
            log.transcripts(step, sample_transcripts(groups, cfg.log.transcripts_per_step))
            refresh_report(run_dir)  # runs/<name>/report.html, replaced atomically
            bar.update(1)
            bar.set_postfix(progress_postfix(metrics))  # tool errors and drops when non-zero

            if checkpoint_due(step, cfg, time.perf_counter() - last_ckpt_at):
                sync.join()  # the buffer saved holds the version the servers serve
                save_checkpoint(ckpt, step, learners, buffer, time.perf_counter() - start)
                last_ckpt, last_ckpt_at = step, time.perf_counter()
        sync.join()  # the last version is served before the checkpoint and the evaluation
        if step != last_ckpt:  # stopped early: the last step is saved as at a normal end
            save_checkpoint(ckpt, step, learners, buffer, time.perf_counter() - start)
        bar.close()
        log.close()
        if stop.requested:
            print(f"stopped after step {step} on {stop.name}: checkpoint saved; re-run to resume")
            raise SystemExit(stop.exit_code)
        if stop_reason == "time_budget":
            print(f"stopped after step {step}: trainer.time_budget_s={budget} s spent")
        stop_workers(workers, runs)  # the held-out evaluation has the servers to itself
        eval_start = time.perf_counter()
        after = None
        if cfg.eval.held_out_tasks:
            after = evaluate(
                cfg, str(servers[0].base_url), client_model, run_dir / "eval" / "after"
            )
        weights = run_dir / "weights" / f"v{step:06d}"
        lean_finished_run(run_dir, ckpt.latest())  # no optimizer, no warm-start copy at the end
        first = clock.first_step_at and clock.first_step_at - clock.process_start
        eval_s = sum(clock.phases.get(k, 0.0) for k in ("eval_base_s", "eval_before_s"))
        extra = {
            "run_dir": str(run_dir),
            "finished": True,
            "stop_reason": stop_reason,
            "time_budget_s": budget,
            "training_s": {  # what the budget counts: the warm start, then RL
                "warm_start": warm_s,
                "rl": round(eval_start - start, 1),
                "total": round(warm_s + eval_start - start, 1),
            },
            "env": cfg.env.name,
            "model": cfg.model.name,
            "torch_threads": threads,
            **clock.summary(),
            "time_to_first_step_without_eval_s": (
                None if first is None or resume_from is not None else round(first - eval_s, 3)
            ),
            "warm_start": warm,
            "held_out": {
                "tasks": cfg.eval.held_out_tasks,
                "seed": cfg.eval.seed,
                "excluded_from_training": held_out is not None,
                "base": base,
                "before": before,
                "after": after,
            },
            "final_weights": str(weights) if weights.is_dir() else None,
            "disk_mb": {
                "checkpoints": disk_mb(run_dir / "checkpoints"),
                "weights": disk_mb(run_dir / "weights"),
                "run_dir": disk_mb(run_dir),
            },
            "times": {
                "total_s": round(time.time() - clock.process_start, 3),
                "eval_s": round(eval_s + time.perf_counter() - eval_start, 3),
            },
        }
        summary = write_summary(run_dir, extra)
        write_transcript_viewer(run_dir, summary)
        refresh_report(run_dir)
        print_summary(summary)
        print(closing_screen(summary))
        return summary
    finally:
        if sync is not None:
            sync.close()  # the weights it staged in shared memory (weight_sync=object_store)
        shutdown(workers, runs, learners, servers, started_ray)
        stop.uninstall()


# ---- helpers the loop names ----------------------------------------------------------------


def check_env(cfg: TrainConfig) -> None:
    """Build the environment once so that a bad name or argument fails before anything starts;
    on a local run, check the CPU placement against this machine's cores."""
    env = make_env(cfg.env.name, **cfg.env.make_kwargs())
    env.close()
    if not cfg.ray.address:  # on a cluster the cores are those of other machines
        check_cpus(cfg.trainer.learner_cpus, "trainer.learner_cpus")
        check_cpus(cfg.inference.cpus, "inference.cpus")


def buffer_options(cfg: TrainConfig) -> dict[str, Any]:
    """The :class:`TrajectoryBuffer` the run's config asks for, as keyword arguments."""
    return {
        "groups_per_step": cfg.trainer.groups_per_step,
        "max_staleness": cfg.trainer.effective_max_staleness,
        "data_seed": cfg.trainer.seed,
        "dynamic_sampling": cfg.algo.dynamic_sampling,
        "batch_order": cfg.trainer.batch_order,
        # nothing is admitted that the run would never train (the last steps drain the rest)
        "total_groups": cfg.trainer.total_steps * cfg.trainer.groups_per_step,
    }


def checkpoint_due(step: int, cfg: TrainConfig, since_last_s: float = 0.0) -> bool:
    """Whether step ``step`` is checkpointed: every ``trainer.checkpoint_every`` steps (0:
    not by count), once ``trainer.checkpoint_interval_s`` seconds have passed since the last
    checkpoint (``since_last_s``), and always the last one."""
    every, interval = cfg.trainer.checkpoint_every, cfg.trainer.checkpoint_interval_s
    by_time = interval is not None and since_last_s >= interval
    return bool(every and step % every == 0) or by_time or step == cfg.trainer.total_steps


def make_sync(cfg: TrainConfig, servers: list[Any], run_dir: Path) -> WeightSync:
    """How the learners' weights reach the servers (``<run>/weights`` on a local run)."""
    return WeightSync(
        cfg.inference,
        servers,
        run_dir / "weights",
        lora=cfg.model.lora,
        on_cluster=bool(cfg.ray.address),
    )


def start_workers(
    cfg: TrainConfig,
    servers: list[Any],
    model_dir: Path,
    buffer: Any,
    exclude_task_ids: frozenset[str] = frozenset(),
    chat_template: str | None = None,
    model: str = "policy",
) -> list[Any]:
    """The rollout workers (Ray actors); each applies ``chat_template`` on its own node."""
    urls = [str(s.base_url) for s in servers]
    actor = remote_class(RolloutWorkerActor)
    return [
        actor.options(
            num_cpus=cfg.ray.actor_cpus,
            max_concurrency=16,
            **spread(bool(cfg.ray.address), i, cfg.ray.actor_cpus),
        ).remote(
            env=cfg.env,
            inference=cfg.inference,
            base_urls=urls,
            model_dir=str(model_dir),
            served_name=model,
            buffer=buffer,
            worker_id=i,
            max_concurrent_groups=cfg.trainer.concurrent_groups,
            exclude_task_ids=exclude_task_ids,
            chat_template=chat_template,
        )
        for i in range(cfg.trainer.rollout_workers)
    ]


def wait_for_batch(
    buffer: Any,
    runs: list[Any],
    bar: Any,
    deadline: float | None = None,
    stop: GracefulStop | None = None,
    poll_s: float = 0.2,
) -> list[Group] | None:
    """The next batch, or None once ``deadline`` has passed or a stop was requested (no batch
    is taken after it); fails fast if a rollout worker died instead of waiting forever."""
    polls = 0
    while True:
        if over(deadline) or (stop is not None and stop.requested):
            return None
        batch = ray.get(buffer.pop_batch.remote())
        if batch is not None:
            return list(batch)
        finished, _ = ray.wait(runs, timeout=0, num_returns=len(runs))
        for ref in finished:
            ray.get(ref)  # re-raises the worker's exception
            raise AgentsError("a rollout worker stopped while the trainer still needs data")
        polls += 1
        if polls % 25 == 0:  # show that generation is moving while the learner waits
            bar.set_postfix_str(waiting_postfix(ray.get(buffer.stats.remote())))
        time.sleep(poll_s)


def save_checkpoint(
    ckpt: CheckpointManager, step: int, learners: LearnerGroup, buffer: Any, elapsed_s: float
) -> Path:
    """Model, optimizer, scheduler, buffer (cursor, in-flight, ready groups), RNG: atomically."""
    tmp = ckpt.begin(step)
    learners.save_checkpoint(tmp / "learner")
    write_json(tmp / "buffer.json", ray.get(buffer.state_dict.remote()))
    save_rng(tmp / "rng.pkl")
    write_json(tmp / "trainer.json", {"step": step, "version": step, "elapsed_s": elapsed_s})
    return ckpt.commit(tmp, step)


def shutdown(
    workers: list[Any],
    runs: list[Any],
    learners: LearnerGroup | None,
    servers: list[Any],
    started_ray: bool,
) -> None:
    """Stop everything this run started, in reverse order; best effort."""
    stop_workers(workers, runs)  # workers close their environments (and sandboxes) on return
    for w in workers:
        ray.kill(w)
    if learners is not None:
        learners.shutdown()
    stop_servers(servers)
    if started_ray:
        stop_ray()
