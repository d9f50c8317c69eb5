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

Before anything loads, the run's actors must fit: one placement group holds a bundle per
learner rank, server and rollout worker (``trainers/placement.py``), or the run fails with
what it needs and what the cluster has. While it runs, a :class:`Supervisor` thread restarts
a server or rollout worker that dies (``trainers/supervisor.py``); a learner rank that dies
sends the run back to its last checkpoint, by itself once (``trainer.resume=auto``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tqdm import tqdm

from areal_agents.errors import LearnerLost
from areal_agents.files import read_json
from areal_agents.trainers.buffer import TrajectoryBuffer
from areal_agents.trainers.checkpoint import CheckpointManager, load_rng
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.held_out import (
    closing_screen,
    disk_mb,
    held_out_before,
    held_out_task_ids,
    paired_gains,
)
from areal_agents.trainers.inference import (
    launch_local_servers,
    server_torch_threads,
    start_server,
    start_servers,
    stop_servers,
)
from areal_agents.trainers.learner_group import LearnerGroup
from areal_agents.trainers.loop_helpers import (
    buffer_options,
    check_env,
    checkpoint_due,
    make_sync,
    reserve,
    save_checkpoint,
    shutdown,
    start_workers,
    wait_for_batch,
)
from areal_agents.trainers.lora import serving_setup
from areal_agents.trainers.metrics import (
    MetricsLogger,
    health_metrics,
    progress_postfix,
    write_summary,
)
from areal_agents.trainers.modeling import model_source, prepare_model_dir
from areal_agents.trainers.placement import (
    Placement,
    check_local_capacity,
    local_free,
    object_store_mb,
    run_bundles,
    weights_mb,
)
from areal_agents.trainers.replay import replay_rows
from areal_agents.trainers.report import refresh_report
from areal_agents.trainers.runtime import (
    choose_run_dir,
    remote_class,
    save_config,
    start_ray,
    stop_workers,
    worker_env,
)
from areal_agents.trainers.selection import final_evaluations, final_weights, keep_candidate
from areal_agents.trainers.step_records import (
    print_summary,
    sample_transcripts,
    step_metrics,
    write_transcript_viewer,
)
from areal_agents.trainers.stop import (
    GracefulStop,
    StartupClock,
    latest_step_start,
    rl_budget_s,
)
from areal_agents.trainers.supervisor import FaultLog, Supervisor
from areal_agents.trainers.warm_start import lean_finished_run, run_warm_start, warm_start_info
from areal_agents.trainers.weight_sync import WeightSync

__all__ = ["buffer_options", "checkpoint_due", "start_workers", "train"]

logger = logging.getLogger(__name__)


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run (or resume) the training described by ``cfg``; returns the run summary.

    A learner rank that dies ends the step in progress (:class:`LearnerLost`): with
    ``trainer.resume=auto`` the run resumes from its last checkpoint by itself, once; otherwise,
    or when it happens again, the run stops with how to resume it.
    """
    try:
        return _train(cfg)
    except LearnerLost as e:
        lost = e
    run_dir, at = getattr(lost, "run_dir", None), getattr(lost, "at", time.time())
    if cfg.trainer.resume != "auto" or run_dir is None:
        raise lost
    print(f"{lost}: resuming from the last checkpoint (trainer.resume=auto)", flush=True)
    again = dataclasses.replace(cfg, output_dir=str(run_dir))
    try:
        return _train(again, lost_at=at)
    except LearnerLost as e:
        e.args = (f"{e} (again, after resuming once by itself)",)
        raise


def _train(cfg: TrainConfig, lost_at: float | None = None) -> dict[str, Any]:
    """:func:`train` once (``lost_at``: when a learner rank of the run before died)."""
    clock = StartupClock()
    run_dir, resume_from = choose_run_dir(cfg)
    check_env(cfg)
    held_out = held_out_task_ids(cfg)  # never trained on; scored before and after
    model_dir = prepare_model_dir(cfg.model, run_dir)  # the chat-template gate: before Ray
    on_cluster = bool(cfg.ray.address)
    # what the actors reserve, and the object store, from the model: checked before any load
    model_mb = weights_mb(model_dir, cfg.model.dtype)
    bundles = run_bundles(cfg, model_mb)
    store_mb = object_store_mb(cfg, model_mb, on_cluster=on_cluster)
    if not on_cluster:
        num_cpus = cfg.ray.num_cpus or os.cpu_count() or 1
        check_local_capacity(bundles, local_free(num_cpus, store_mb), cfg.ray.placement_strategy)
    # what other nodes get: the model's own directory and the template, never the run directory
    shared_dir, template = model_source(model_dir) if on_cluster else (model_dir, None)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir)
    faults = FaultLog(run_dir)
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
    placement: Placement | None = None
    supervisor: Supervisor | None = None
    started_ray = False
    step = 0
    try:
        if not on_cluster:  # local servers load the model while Ray starts
            os.environ.update({k: v for k, v in worker_env().items() if k not in os.environ})
            servers = launch_local_servers(serving, model_dir, "policy", run_dir / "logs")
        # a fresh run's supervised warm start (while the servers load the base model): the
        # learners start from it; a resumed run's checkpoint holds every weight anyway
        warm = run_warm_start(cfg, model_dir, run_dir, held_out) if resume_from is None else None
        learner_dir = run_dir / "warm_start" if warm else shared_dir  # weights only: no template
        replay = replay_rows(cfg, model_dir, held_out) if cfg.algo.replay_coef > 0 else []
        clock.mark("warm_start_s")
        started_ray = start_ray(cfg.ray, object_store_mb=store_mb)
        stop.install()
        placement = reserve(cfg, bundles)
        clock.mark("ray_s")
        on_nodes = placement if on_cluster else None  # local servers are this process's children
        # ---- set-up: learners (loading meanwhile), servers, buffer; restore the checkpoint --
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learners") as pool:
            building = pool.submit(LearnerGroup, cfg, learner_dir, placement, replay)
            servers = start_servers(
                serving,
                shared_dir,
                "policy",
                placement=on_nodes,
                log_dir=run_dir / "logs",
                launched=servers,
                chat_template=template,
            )
            clock.mark("servers_s")
            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), False)
            buffer = (  # on the driver's node: it lives as long as the run
                remote_class(TrajectoryBuffer)
                .options(num_cpus=0, scheduling_strategy=here)
                .remote(**buffer_options(cfg, held_out))
            )
            base = None
            served_dir = shared_dir  # what a restarted server loads before its weights
            if warm:  # the base model first, then servers on the warm-started one (version 0)
                base = held_out_before(cfg, servers, run_dir, client_model, fresh=True, name="base")
                clock.mark("eval_base_s")
                stop_servers(servers)
                servers = []
                servers = start_servers(
                    serving,
                    learner_dir,
                    "policy",
                    placement=on_nodes,
                    log_dir=run_dir / "logs",
                )
                served_dir = learner_dir
                clock.mark("servers_warm_s")
            elif resume_from is not None:
                base = held_out_before(
                    cfg, servers, run_dir, client_model, fresh=False, name="base"
                )
            before = held_out_before(cfg, servers, run_dir, client_model, fresh=resume_from is None)
            clock.mark("eval_before_s")

            def new_worker(index: int, incarnation: int, urls: list[str]) -> Any:
                """Rollout worker ``index`` in its bundle, on the servers at ``urls``."""
                return start_workers(
                    cfg,
                    servers,
                    shared_dir,
                    buffer,
                    held_out or frozenset(),
                    template,
                    model=client_model,
                    placement=placement,
                    only=(index, incarnation, urls),
                )[0]

            def start_rollouts() -> None:
                """The rollout workers on the servers in use, each already running."""
                assert placement is not None
                for i in range(cfg.trainer.rollout_workers):
                    near = placement.servers_near(i, len(servers))
                    workers.append(new_worker(i, 0, [str(servers[j].base_url) for j in near]))
                runs.extend(w.run.remote() for w in workers)

            if resume_from is None:  # a fresh run: the first rollouts overlap the learners' load
                start_rollouts()
            learners = building.result()
        clock.mark("learners_s")  # the part of the learners' load that servers did not overlap
        threads = {
            "learner": learners.info["torch_threads"],
            "servers": server_torch_threads(servers),
        }
        sync = make_sync(cfg, servers, run_dir)
        elapsed_before = 0.0
        if resume_from is not None:
            step = learners.load_checkpoint(resume_from / "learner")
            ray.get(buffer.load_state_dict.remote(state=read_json(resume_from / "buffer.json")))
            load_rng(resume_from / "rng.pkl")
            elapsed_before = float(read_json(resume_from / "trainer.json")["elapsed_s"])
            sync.push(learners, step)  # the servers start from the base weights
            ray.get(buffer.set_version.remote(version=step))
            # ---- rollout workers generate in the background from here on -----------------
            start_rollouts()
        else:  # the weights RL starts from: a candidate for the final policy
            keep_candidate(cfg, learners, run_dir, 0)
        if lost_at is not None:  # the loss of the run before, now that it is back
            resumed = resume_from.name if resume_from else None
            restart_s = round(time.time() - lost_at, 3)
            faults.record("learner", step=step, resumed_from=resumed, restart_s=restart_s)
        supervisor = Supervisor(
            servers=servers,
            sync=sync,
            buffer=buffer,
            placement=placement,
            start_server=lambda i: start_server(
                serving,
                served_dir,
                "policy",
                i,
                placement=on_nodes,
                log_dir=run_dir / "logs",
                chat_template=template,
            ),
            start_worker=new_worker,
            workers=workers,
            runs=runs,
            max_restarts=cfg.ray.max_restarts,
            faults=faults,
            step=lambda: step,
            placement_timeout_s=cfg.ray.placement_timeout_s,
        ).start()
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
            groups = (
                None
                if stop.requested
                else wait_for_batch(buffer, supervisor, bar, last_start, stop)
            )
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
            metrics.update({f"restarts/{k}": v for k, v in faults.counts().items()})
            log.log(step, metrics)
            log.transcripts(step, sample_transcripts(groups, cfg.log.transcripts_per_step))
            refresh_report(run_dir)  # runs/<name>/report.html, replaced atomically
            bar.update(1)
            bar.set_postfix(progress_postfix(metrics))  # tool errors and drops when non-zero

            keep_candidate(cfg, learners, run_dir, step)  # every eval.validation_every steps
            if checkpoint_due(step, cfg, time.perf_counter() - last_ckpt_at):
                sync.join()  # the buffer saved holds the version the servers serve
                save_checkpoint(ckpt, step, learners, buffer, time.perf_counter() - start)
                last_ckpt, last_ckpt_at = step, time.perf_counter()
        sync.join()  # the last version is served before the checkpoint and the evaluation
        if step != last_ckpt:  # stopped early: the last step is saved as at a normal end
            save_checkpoint(ckpt, step, learners, buffer, time.perf_counter() - start)
        supervisor.stop()  # from here on a death ends the run (the evaluation has the servers)
        supervisor.raise_if_failed()
        bar.close()
        log.close()
        if stop.requested:
            print(f"stopped after step {step} on {stop.name}: checkpoint saved; re-run to resume")
            raise SystemExit(stop.exit_code)
        if stop_reason == "time_budget":
            print(f"stopped after step {step}: trainer.time_budget_s={budget} s spent")
        stop_workers(workers, runs)  # the held-out evaluation has the servers to itself
        eval_start = time.perf_counter()
        # the final policy (chosen on validation tasks, eval.validation_tasks) and its scores
        after, last_scored, selection = final_evaluations(
            cfg, learners, servers[0], client_model, run_dir, step
        )
        weights = final_weights(run_dir, selection, step)
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
                "last": last_scored,  # the last step's weights, where validation chose another
                "selection": selection,
                # each change on the same tasks, with its CI
                **paired_gains(run_dir / "eval", cfg.warm_start.exclude_families),
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
            "restarts": faults.counts(),
        }
        summary = write_summary(run_dir, extra)
        write_transcript_viewer(run_dir, summary)
        refresh_report(run_dir)
        print_summary(summary)
        print(closing_screen(summary))
        return summary
    except LearnerLost as e:
        last = ckpt.latest()
        e.run_dir, e.at = run_dir, time.time()  # type: ignore[attr-defined]
        e.args = (
            f"{e} during step {step + 1}: that step is lost; the run's last checkpoint is "
            f"{last.name if last else 'none (it starts over)'}. To resume: run the same command "
            f"with output_dir={run_dir} trainer.resume=auto",
        )
        raise
    finally:
        if supervisor is not None:
            supervisor.stop()
        if sync is not None:
            sync.close()  # the weights it staged in shared memory (weight_sync=object_store)
        shutdown(workers, runs, learners, servers, started_ray, placement)
        stop.uninstall()
