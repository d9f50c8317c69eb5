"""The command lines as Hydra applications: sweeps, --cfg, --config-dir, interpolation,
errors that name the key, and run directories where users expect them."""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from areal_agents.config import compose, from_dict, group_fields, load_config
from areal_agents.errors import ConfigError
from areal_agents.train import main
from areal_agents.trainers.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
TINY = ["env=calculator", "model=tiny", "env.group_size=2", "log.progress=false"]


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory: what a command leaves there is visible."""
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    return here


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[TrainConfig]:
    """``trainers.loop.train`` replaced by a recorder: the jobs Hydra launched, in order."""
    from areal_agents.trainers import loop

    seen: list[TrainConfig] = []

    def record(cfg: TrainConfig) -> dict[str, Any]:
        seen.append(cfg)
        return {"run_dir": str(cfg.run_dir())}

    monkeypatch.setattr(loop, "train", record)
    return seen


def test_every_preset_of_every_group_is_a_hydra_option() -> None:
    groups = group_fields(TrainConfig)
    assert set(groups) == {"env", "algo", "model", "inference"}
    for group, tp in groups.items():
        names = tp.preset_names()  # type: ignore[attr-defined]
        assert names, group
        for name in names:
            node = compose(TrainConfig, [f"{group}={name}", "env.group_size=2"])
            if hasattr(tp, "with_preset"):  # inference: the recipe's section, moved to the engine
                expected = getattr(TrainConfig(), group).with_preset(name)[0]
            else:
                expected = tp.from_name(name)  # type: ignore[attr-defined]
            if group == "env":
                expected.group_size = 2
            # what Hydra composed (TrainConfig may then derive values: algo.norm_tokens)
            assert from_dict(tp, OmegaConf.to_container(node[group], resolve=True)) == expected


def test_open_ended_group_options_and_dict_keys() -> None:
    cfg = load_config(
        TrainConfig,
        ["env=acme/MyTask-v0", "env.kwargs.sandbox=docker", "model=/models/mine", "algo=rloo"],
    )
    assert cfg.env.name == "acme/MyTask-v0" and cfg.env.kwargs == {"sandbox": "docker"}
    assert cfg.model.name == "/models/mine" and cfg.algo.name == "rloo"
    with pytest.raises(ConfigError, match=r"unknown config key 'env\.kwarg'.*did you mean"):
        load_config(TrainConfig, ["+env.kwarg.x=1"])


def test_interpolation_resolves_before_the_dataclasses_check_it() -> None:
    cfg = load_config(
        TrainConfig, ["env.group_size=3", "trainer.groups_per_step=${env.group_size}"]
    )
    assert cfg.trainer.groups_per_step == 3
    with pytest.raises(ConfigError, match=r"trainer\.seed: .*'nope'"):
        load_config(TrainConfig, ["trainer.seed=${nope}"])


def test_cfg_job_prints_the_composition_and_starts_nothing(
    cwd: Path, capsys: pytest.CaptureFixture[str], trained: list[TrainConfig]
) -> None:
    main(["--cfg", "job", "algo=rloo", *TINY])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["algo"]["name"] == "rloo" and printed["env"]["group_size"] == 2
    assert printed["env"]["name"] == "calculator" and printed["model"]["name"] == "tiny"
    assert not trained and not list(cwd.iterdir())


def test_config_dir_with_a_user_yaml_that_selects_a_group_and_sets_keys(
    tmp_path: Path, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "conf"
    (conf / "env").mkdir(parents=True)
    (conf / "exp.yaml").write_text(
        "defaults:\n  - train\n  - override /algo: rloo\n  - _self_\n"
        "trainer:\n  total_steps: 7\n  seed: ${trainer.total_steps}\n"
    )
    (conf / "env" / "mycalc.yaml").write_text("name: calculator\ngroup_size: 3\nmax_turns: 2\n")
    main(["--config-dir", str(conf), "--config-name", "exp", "model=tiny", "env=mycalc", "--check"])
    out = capsys.readouterr().out
    cfg = yaml.safe_load(out.split("configuration OK")[0])
    assert cfg["algo"]["name"] == "rloo" and cfg["trainer"]["total_steps"] == 7
    assert cfg["trainer"]["seed"] == 7  # interpolated in the user's file
    assert cfg["env"] == {**cfg["env"], "name": "calculator", "group_size": 3, "max_turns": 2}
    assert not list(cwd.iterdir())


def test_multirun_check_validates_every_job(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["-m", "algo=grpo,rloo", "trainer.max_staleness=0,2", *TINY, "--check"])
    out = capsys.readouterr().out
    assert out.count("configuration OK") == 4
    assert "# job 3: algo=rloo trainer.max_staleness=2" in out
    assert "hydra.sweep.dir/3" in out and not list(cwd.iterdir())


def test_a_bad_job_of_a_sweep_fails_before_any_job_starts(
    cwd: Path, capsys: pytest.CaptureFixture[str], trained: list[TrainConfig]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["-m", "trainer.mode=sync", "trainer.max_staleness=0,2", *TINY])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: job 1 (trainer.mode=sync trainer.max_staleness=2")
    assert "sync mode trains with staleness 0" in err
    assert not trained and not list(cwd.iterdir())


def test_multirun_runs_each_job_in_its_own_directory_under_the_sweep_dir(
    tmp_path: Path, cwd: Path, trained: list[TrainConfig]
) -> None:
    sweep = tmp_path / "sweep"
    main(["-m", "algo=grpo,rloo", *TINY, f"hydra.sweep.dir={sweep}"])
    assert [c.algo.name for c in trained] == ["grpo", "rloo"]
    assert [c.output_dir for c in trained] == [str(sweep / "0"), str(sweep / "1")]
    for num in ("0", "1"):
        saved = yaml.safe_load((sweep / num / ".hydra" / "overrides.yaml").read_text())
        assert f"algo={('grpo', 'rloo')[int(num)]}" in saved
    assert (sweep / "multirun.yaml").is_file()
    assert not list(cwd.iterdir())  # no outputs/, multirun/ or .hydra/ in the cwd


def test_sweep_jobs_sharing_an_output_dir_are_refused(
    tmp_path: Path, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["-m", "trainer.seed=0,1", *TINY, f"output_dir={tmp_path / 'same'}", "--check"])
    assert e.value.code == 2
    assert "jobs 0 and 1 of the sweep would write to the same run directory" in (
        capsys.readouterr().err
    )
    main(["-m", "trainer.seed=0,1", *TINY, f"output_dir={tmp_path}/r${{hydra:job.num}}", "--check"])
    out = capsys.readouterr().out
    assert f"go to {tmp_path}/r0" in out and f"go to {tmp_path}/r1" in out


def test_a_single_run_keeps_its_directory_and_hydra_writes_only_there(
    tmp_path: Path, cwd: Path, trained: list[TrainConfig]
) -> None:
    main([*TINY, "trainer.total_steps=1"])
    assert [str(c.run_dir()) for c in trained] == ["runs/calculator-grpo"]
    run = cwd / "runs" / "calculator-grpo"
    assert (run / ".hydra" / "config.yaml").is_file()
    assert sorted(p.name for p in cwd.iterdir()) == ["runs"]
    main([*TINY, f"output_dir={tmp_path / 'mine'}"])
    assert trained[-1].output_dir == str(tmp_path / "mine")
    assert (tmp_path / "mine" / ".hydra" / "overrides.yaml").is_file()


def test_the_process_exits_2_naming_the_key_with_a_suggestion(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "areal_agents.train", "-m", "trainer.max_stalenes=3,4"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and "did you mean 'max_staleness'" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.iterdir())


def test_a_group_of_one_root_is_a_plain_key_of_another_in_the_same_process() -> None:
    from areal_agents.eval_config import EvalConfig

    assert load_config(TrainConfig, ["env=math_python"]).env.name == "math_python"
    assert load_config(EvalConfig, ["env=calculator"]).env == "calculator"  # a str, no group
    assert load_config(TrainConfig, ["env=calculator"]).env.max_turns == 2  # the preset again


# ---- Hydra's public API only ------------------------------------------------------------------

#: The Hydra modules areal_agents may import: the package's own API (``hydra.main``,
#: ``hydra.compose``, ``hydra.initialize*``, its errors and types) and the documented classes
#: under ``hydra.core``: ``ConfigStore`` (structured configs), ``HydraConfig`` (accessing the
#: Hydra config), ``GlobalHydra`` (the compose API's global state) and the override grammar's
#: parser (what sweeper plugins use). Anything under ``hydra._internal`` and any name with a
#: leading underscore is Hydra's private business: a release may change it without notice.
PUBLIC_HYDRA = {
    "hydra",
    "hydra.errors",
    "hydra.types",
    "hydra.utils",
    "hydra.core.config_store",
    "hydra.core.hydra_config",
    "hydra.core.global_hydra",
    "hydra.core.override_parser.overrides_parser",
    "hydra.core.override_parser.types",
}


def hydra_uses(path: Path) -> list[str]:
    """What ``path`` takes from Hydra: ``module`` or ``module:name``, ``hydra.<attr>``
    attribute chains (``hydra._internal.utils``) read off an imported ``hydra``, and modules
    imported by name (``importlib.import_module("hydra._internal.utils")``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "hydra"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hydra":
            found += [f"{node.module}:{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "hydra":
            found.append(f"hydra:{node.attr}")
        elif isinstance(node, ast.Call) and (named := _imported_by_name(node)):
            found.append(named)
    return found


def _imported_by_name(call: ast.Call) -> str | None:
    """``X`` of ``importlib.import_module("X")`` or ``__import__("X")`` when X is Hydra's."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    first = call.args[0] if call.args else None
    if name not in ("import_module", "__import__") or not isinstance(first, ast.Constant):
        return None
    value = first.value
    return value if isinstance(value, str) and value.split(".")[0] == "hydra" else None


def python_files() -> list[Path]:
    """The repository's own Python files: the package, tests, benchmarks, examples, scripts."""
    return [
        path
        for top in ("areal_agents", "tests", "benchmarks", "examples", "scripts")
        for path in sorted((ROOT / top).rglob("*.py"))
    ]


def private(use: str) -> bool:
    module, _, name = use.partition(":")
    is_module = name and f"{module}.{name}" in PUBLIC_HYDRA
    dunder = name.startswith("__") and name.endswith("__")  # hydra.__version__
    return (module not in PUBLIC_HYDRA and not is_module) or (name.startswith("_") and not dunder)


def test_areal_agents_uses_only_hydras_public_api(tmp_path: Path) -> None:
    """Nor do its tests, benchmarks, examples and scripts, whichever way they import."""
    uses = {
        f"{path.relative_to(ROOT)}: {use}" for path in python_files() for use in hydra_uses(path)
    }
    assert any("cli.py: hydra:main" in u for u in uses)  # the jobs run through @hydra.main
    assert Path(__file__).resolve() in python_files()  # the whole repository is read
    assert [u for u in sorted(uses) if private(u.split(": ", 1)[1])] == []
    # the checker itself sees what the command line used to call, and imports by name
    assert private("hydra._internal.utils:_run_hydra") and private("hydra:_internal")
    assert private("hydra._internal.core_plugins.basic_sweeper:BasicSweeper")
    assert not private("hydra.core.config_store:ConfigStore") and not private("hydra:compose")
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        "import importlib\n"
        "importlib.import_module('hydra._internal.utils')\n"
        "__import__('hydra._internal.hydra')\n"
    )
    assert [private(u) for u in hydra_uses(sneaky)] == [True, True]


def test_hydras_flags_behave_as_in_any_hydra_app(
    tmp_path: Path,
    cwd: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    trained: list[TrainConfig],
) -> None:
    main(["--cfg", "job", "--resolve", *TINY, "trainer.seed=${trainer.total_steps}"])
    out = capsys.readouterr().out
    job = yaml.safe_load(out)["trainer"]  # the interpolation resolved to the recipe's value
    assert job["seed"] == job["total_steps"] == TrainConfig().trainer.total_steps, out[:500]
    sweep = tmp_path / "sweep"
    main([*TINY, "algo=grpo,rloo", f"hydra.sweep.dir={sweep}", "-m"])  # -m anywhere
    assert [c.algo.name for c in trained] == ["grpo", "rloo"]
    assert [c.output_dir for c in trained] == [str(sweep / "0"), str(sweep / "1")]
    assert Path.cwd() == cwd and not list(cwd.iterdir())  # no chdir, nothing written here
    assert f"results in {sweep / '1'}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("Hydra 1.")
    loggers = {name: list(log.handlers) for name, log in logging.root.manager.loggerDict.items()
               if isinstance(log, logging.Logger)}  # fmt: skip
    root = list(logging.root.handlers)
    try:
        main(["--info", "defaults", *TINY])  # Hydra's own answer (logged), nothing run
    finally:  # --info sets up Hydra's logging on this test's captured stdout: undo it
        logging.root.handlers[:] = root
        for name, handlers in loggers.items():
            logging.getLogger(name).handlers[:] = handlers
    assert "model/tiny" in capsys.readouterr().out + caplog.text
    assert not trained[2:] and not list(cwd.iterdir())


# ---- switching the inference engine keeps the recipe ----------------------------------------


def cfg_job(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    """``--cfg job`` of ``argv``: the composed configuration, and what went to stderr."""
    main(["--cfg", "job", *argv])
    out, err = capsys.readouterr()
    return yaml.safe_load(out), err


def test_switching_the_engine_keeps_the_recipe_and_says_what_it_adapted(
    cwd: Path, capsys: pytest.CaptureFixture[str], trained: list[TrainConfig]
) -> None:
    before, err = cfg_job([], capsys)
    assert before["inference"]["max_tokens"] == 80 and before["inference"]["torch_threads"] == 1
    assert "note:" not in err
    expected = {**before, "inference": {**before["inference"], "engine": "vllm"}}
    expected["inference"]["torch_threads"] = None  # vLLM takes its threads from its own binding
    for switch in (["inference=vllm"], ["inference.engine=vllm"]):
        after, err = cfg_job(switch, capsys)
        assert after == expected, switch  # nothing else moved: max_tokens stays 80
    # one line said what was adapted (once per process: the second switch says nothing new)
    main(["--check", "inference=vllm", *TINY])
    out, err = capsys.readouterr()
    assert "torch_threads: null" in out and "configuration OK" in out
    # what the user sets is kept and checked as given; the engine's other values too
    after, err = cfg_job(["inference.engine=vllm", "inference.max_tokens=99"], capsys)
    assert after["inference"] == {**expected["inference"], "max_tokens": 99}
    with pytest.raises(SystemExit) as e:
        main(["--check", "inference=vllm", "inference.torch_threads=2", *TINY])
    assert e.value.code == 2 and "torch_threads does not apply" in capsys.readouterr().err
    # back to the built-in engine: the recipe as it was
    assert cfg_job(["inference.engine=builtin"], capsys)[0] == before
    assert not trained and not list(cwd.iterdir())


def test_the_engine_switch_prints_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "areal_agents.train", "--cfg", "job", "inference.engine=vllm"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "note: inference.engine=vllm: inference.torch_threads=1 of the defaults left unset "
        "(vLLM on CPU takes its threads from VLLM_CPU_OMP_THREADS_BIND)"
    ]
    assert yaml.safe_load(proc.stdout)["inference"]["max_tokens"] == 80
