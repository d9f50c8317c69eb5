"""``python -m areal_agents.eval`` against a strict fake OpenAI server with a scripted agent.

The fake (tests/policies/fake_openai.py) validates every request against the OpenAI spec and
answers from a script, so the expected scores are known exactly: every episode first calls a
misspelt tool (a counted tool error), then the calculator, then answers; of the two samples of
each task, exactly one answers correctly.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import yaml

from areal_agents.envs.calculator import safe_eval
from areal_agents.errors import ConfigError
from areal_agents.eval import EvalPolicyConfig, main, pass_at_k
from tests.policies.fake_openai import FakeOpenAI

pytestmark = pytest.mark.integration


class CalculatorAgent:
    """The scripted agent behind the fake endpoint."""

    def __init__(self) -> None:
        self.answers: Counter[str] = Counter()

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        question = next(m["content"] for m in messages if m["role"] == "user")
        if question.startswith("Repeat the word: "):
            return {"content": question.removeprefix("Repeat the word: ")}
        expression = re.fullmatch(r"What is (.*)\?", question).group(1)  # type: ignore[union-attr]
        last = messages[-1]
        if last["role"] == "user":
            return self._call("calculater", expression, "call_typo")  # not a tool: an error
        if last["content"].startswith("Error: unknown tool"):
            return self._call("calculator", expression, "call_ok")
        value = int(last["content"])
        self.answers[question] += 1
        correct = self.answers[question] % 2 == 1  # the first answer to a task is right
        return {"content": f"The answer is \\boxed{{{value if correct else value + 1}}}."}

    @staticmethod
    def _call(name: str, expression: str, call_id: str) -> dict[str, Any]:
        arguments = json.dumps({"expression": expression})
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        return {"content": None, "tool_calls": [call]}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("AREAL_API_KEY", raising=False)
    with FakeOpenAI(CalculatorAgent()).running() as server:
        yield server


def _args(fake: FakeOpenAI, out: Path, *extra: str) -> list[str]:
    return [
        f"policy.base_url={fake.base_url}",
        "policy.model=scripted",
        f"output_dir={out}",
        "progress=false",
        *extra,
    ]


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 4, 2) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_eval_scores_a_scripted_agent_exactly(fake: FakeOpenAI, tmp_path: Path) -> None:
    summary = main(
        _args(
            fake,
            tmp_path,
            "env=calculator",
            "num_episodes=8",
            "samples_per_task=2",
            "concurrency=4",
        )
    )
    assert summary["episodes"] == 8 and summary["tasks"] == 4 and summary["episodes_dropped"] == 0
    assert summary["mean_reward"] == 0.5
    assert summary["pass@1"] == 0.5 and summary["pass@2"] == 1.0
    assert summary["turns_per_episode"] == 3.0
    assert summary["tool_calls_per_episode"] == 2.0
    assert summary["tool_errors"]["unknown_tool"] == 8 and summary["tool_error_rate"] == 0.5
    assert summary["completion_tokens_per_episode"] == 21.0  # 3 answers x 7 tokens (usage)
    assert len(fake.requests) == 24

    lines = (tmp_path / "transcripts.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert sorted(r["key"] for r in records) == [
        f"{i:05d}-{j:03d}" for i in range(4) for j in range(2)
    ]
    env = gym.make("areal_agents/Calculator-v0")
    for r in records:  # task i is the one reset(seed=i) draws, independently re-derived here
        _, info = env.reset(seed=r["task_index"])
        expression = env.unwrapped.task.metadata["expression"]  # type: ignore[attr-defined]
        assert (
            r["task_id"] == info["task_id"]
            and r["messages"][1]["content"] == f"What is {expression}?"
        )
        tool_result = r["messages"][5]
        assert tool_result["role"] == "tool" and int(tool_result["content"]) == safe_eval(
            expression
        )
    assert json.loads((tmp_path / "summary.json").read_text())["pass@2"] == 1.0
    assert "env: calculator" in (tmp_path / "config.yaml").read_text()


def test_eval_resume_plays_only_missing_episodes(fake: FakeOpenAI, tmp_path: Path) -> None:
    main(_args(fake, tmp_path, "num_episodes=4"))
    path = tmp_path / "transcripts.jsonl"
    lines = path.read_text().splitlines()
    kept = sorted(lines)[:2]
    path.write_text("\n".join(kept) + '\n{"key": "00003-000", "rew')  # a crash mid-line
    fake.requests.clear()
    summary = main([*_args(fake, tmp_path, "num_episodes=4"), "--resume"])
    assert len(fake.requests) == 2 * 3  # two episodes replayed, three requests each
    assert summary["episodes"] == 4
    lines = path.read_text().splitlines()
    assert [json.loads(x) for x in lines[:2]] == [json.loads(x) for x in kept]  # kept as they were
    keys = [json.loads(x)["key"] for x in lines]
    assert sorted(keys) == ["00000-000", "00001-000", "00002-000", "00003-000"]
    with pytest.raises(ConfigError, match="seed"):
        main([*_args(fake, tmp_path, "num_episodes=4", "seed=9"), "--resume"])


def test_eval_runs_a_user_environment_by_module_and_id(
    fake: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "acme_echo.py"
    module.write_text(
        textwrap.dedent("""
        import gymnasium as gym
        from areal_agents.envs.base import MultiTurnEnv, Score, Task

        class EchoEnv(MultiTurnEnv):
            def sample_task(self, rng):
                word = ["apple", "river", "stone"][int(rng.integers(3))]
                return Task(id=word, prompt=f"Repeat the word: {word}", answer=word)

            def score(self, task, submission, turn):
                return Score(float(submission.strip() == task.answer))

        if "acme/Echo-v0" not in gym.registry:
            gym.register(id="acme/Echo-v0", entry_point=EchoEnv)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    summary = main(_args(fake, tmp_path / "out", "env=acme_echo:acme/Echo-v0", "num_episodes=3"))
    assert summary["episodes"] == 3 and summary["mean_reward"] == 1.0
    assert summary["turns_per_episode"] == 1.0 and summary["tool_call_attempts"] == 0
    assert all("tools" not in r for r in fake.requests)  # no tools: none sent


def test_eval_rejects_bad_configuration(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="multiple of"):
        main(["num_episodes=3", "samples_per_task=2", f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="unknown environment"):
        main(["env=no_such_env", "policy.base_url=http://127.0.0.1:9/v1", f"output_dir={tmp_path}"])


@pytest.mark.browser
def test_the_viewer_renders_in_headless_chromium(fake: FakeOpenAI, tmp_path: Path) -> None:
    main(_args(fake, tmp_path, "num_episodes=4", "samples_per_task=2"))
    page = tmp_path / "index.html"

    def dump(fragment: str) -> str:
        chromium = shutil.which("chromium") or "chromium"
        profile = tmp_path / f"profile{len(fragment)}"
        command = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}", "--dump-dom", page.as_uri() + fragment,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    dom = dump("")
    assert dom.count('class="episode pass"') == 2 and dom.count('class="episode fail"') == 2
    assert 'data-shown="4"' in dom and "showing 4 of 4" in dom
    assert "calculater" in dom and "Error: unknown tool" in dom  # tool calls and results
    assert "pass@2=1" in dom  # the summary header
    passed = dump("#outcome=pass")
    assert passed.count('class="episode pass"') == 2 and 'class="episode fail"' not in passed
    assert "showing 2 of 4" in passed
    assert 'data-shown="0"' in dump("#min=2")


BAD_SETTINGS = [
    (["env=nosuchns/Nope-v0"], r"env='nosuchns/Nope-v0': Namespace nosuchns not found"),
    (["env=nosuchmodule:Env-v0"], r"env='nosuchmodule:Env-v0': cannot import module"),
    (["env_kwargs={bogus: 1}"], r"env_kwargs: CalculatorEnv got an unknown option 'bogus'"),
    (["env_kwargs={max_turns: 0}"], r"env_kwargs: max_turns=0"),
    (["output_dir=/proc/nope"], r"output_dir=/proc/nope: cannot write there"),
    (["seed=-1"], r"seed=-1: must not be negative"),
    (["policy.timeout_s=-1"], r"policy\.timeout_s=-1\.0: a duration must be positive"),
    (["policy.timeout_s=0"], r"policy\.timeout_s=0\.0"),
    (["policy.max_retries=-1"], r"policy\.max_retries=-1: must not be negative"),
    (["policy.temperature=-7"], r"policy\.temperature=-7\.0"),
    (["policy.temperature=nan"], r"policy\.temperature=nan: must be a finite number"),
    (["policy.top_p=0"], r"policy\.top_p=0\.0"),
    (["pass_threshold=nan"], r"pass_threshold=nan"),
    (["samples_per_task=4", "policy.temperature=0"], r"policy\.temperature=0 with samples_per"),
    (["--resume", "overwrite=true"], r"resume=true and overwrite=true: choose one"),
]


@pytest.mark.parametrize(("extra", "message"), BAD_SETTINGS)
def test_bad_settings_are_refused_before_anything_starts(
    extra: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from areal_agents.serving import server

    def no_server(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the built-in server was started")

    monkeypatch.setattr(server, "BuiltinServer", no_server)  # no base_url: it would start one
    args = ["policy.model=x", f"output_dir={tmp_path / 'out'}", *extra]
    with pytest.raises(ConfigError, match=message):
        main(args)
    monkeypatch.setattr(sys, "argv", ["eval", *args])
    with pytest.raises(SystemExit) as exit_info:  # the command line: a line, no traceback
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.match(rf"error: .*{message}", err) and "Traceback" not in err
    assert not (tmp_path / "out" / "config.yaml").exists()


def test_the_command_line_refuses_an_unknown_namespace_without_a_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "areal_agents.eval", "env=acme/Nope-v0", "policy.model=x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: env='acme/Nope-v0'") and "Traceback" not in proc.stderr


def test_an_output_dir_holding_an_evaluation_is_refused_unless_resume_or_overwrite(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    first = main(_args(fake, tmp_path, "num_episodes=2"))
    assert first["episodes"] == 2
    before = (tmp_path / "transcripts.jsonl").read_text()
    with pytest.raises(ConfigError, match=r"already holds an evaluation .*--resume.*overwrite"):
        main(_args(fake, tmp_path, "num_episodes=2"))
    assert (tmp_path / "transcripts.jsonl").read_text() == before  # nothing was touched
    fake.requests.clear()
    again = main(_args(fake, tmp_path, "num_episodes=2", "overwrite=true"))
    assert again["episodes"] == 2 and len(fake.requests) == 2 * 3  # played again, replaced


@pytest.mark.parametrize(
    ("extra", "temperature"),
    [
        (["samples_per_task=1"], 0.0),  # one sample: greedy
        (["samples_per_task=2"], 1.0),  # pass@k: sampled, as evaluation harnesses do
        (["samples_per_task=2", "policy.temperature=0.6"], 0.6),  # the user's choice stands
    ],
)
def test_pass_at_k_samples_with_a_temperature_and_the_summary_says_so(
    extra: list[str], temperature: float, fake: FakeOpenAI, tmp_path: Path
) -> None:
    summary = main(_args(fake, tmp_path, "num_episodes=2", "policy.max_tokens=64", *extra))
    assert {r["temperature"] for r in fake.requests} == {temperature}
    saved = json.loads((tmp_path / "summary.json").read_text())
    samples = int(extra[0].removeprefix("samples_per_task="))
    settings = {"temperature": temperature, "top_p": 1.0, "max_tokens": 64}
    assert saved["sampling"] == summary["sampling"] == {**settings, "samples_per_task": samples}


def test_help_lists_every_key_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--help"])
    out = capsys.readouterr().out
    expected = ("policy.max_tokens=512", "policy.temperature=None", "output_dir=''")
    for line in (*expected, "config=FILE.yaml", "--resume", "--check"):
        assert line in out


def test_check_validates_and_starts_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "out"
    assert main(["--check", "policy.model=x", f"output_dir={out}"]) == {}
    assert "configuration OK" in capsys.readouterr().out
    assert not out.exists()  # nothing created


def test_a_sweep_plays_each_job_in_its_own_directory(
    fake: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    cwd, sweep = tmp_path / "cwd", tmp_path / "sweep"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    args = [f"policy.base_url={fake.base_url}", "policy.model=scripted", "progress=false"]
    last = main(["-m", "seed=0,100", "num_episodes=2", *args, f"hydra.sweep.dir={sweep}"])
    for num, seed in ((0, 0), (1, 100)):
        saved = yaml.safe_load((sweep / str(num) / "config.yaml").read_text())
        assert (saved["seed"], saved["output_dir"]) == (seed, str(sweep / str(num)))
        assert (sweep / str(num) / "summary.json").is_file()
        assert (sweep / str(num) / ".hydra" / "overrides.yaml").is_file()
    assert last == json.loads((sweep / "1" / "summary.json").read_text())
    assert not list(cwd.iterdir())  # neither outputs/eval nor Hydra's outputs/ in the cwd


def test_an_evaluation_closes_its_connections_before_its_loop_ends(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    """A pool left open is closed later by the garbage collector, on whatever loop runs then
    (the trainer's next evaluation), which prints ``RuntimeError: Event loop is closed``."""
    import asyncio

    from areal_agents.config import load_config
    from areal_agents.eval import EvalConfig, _make_policy, run_eval

    cfg = load_config(EvalConfig, _args(fake, tmp_path, "env=calculator", "num_episodes=2"))
    policy: Any = _make_policy(cfg.policy, fake.base_url, "scripted", cfg.temperature)
    opened: list[Any] = []
    real = policy.endpoint.client

    def client() -> Any:
        opened.append(real())
        return opened[-1]

    policy.endpoint.client = client
    summary = asyncio.run(run_eval(cfg, policy))
    assert summary["episodes"] == 2
    assert opened and all(c.is_closed() for c in opened)
    assert policy.endpoint._clients == {}


# ---- one folder per run ------------------------------------------------------------------------


def test_runs_without_an_output_dir_get_a_folder_each(
    fake: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [f"policy.base_url={fake.base_url}", "policy.model=scripted", "progress=false"]
    for _ in range(2):  # the same command twice in a row (same second, most likely)
        assert main([*args, "num_episodes=2"])["episodes"] == 2
    runs = sorted((tmp_path / "outputs" / "eval").glob("*/*"))
    assert len(runs) == 2 and all((r / "summary.json").is_file() for r in runs), runs
    assert runs[0].name.split("_")[1:] == ["calculator", "scripted"]  # time, env, model
    saved = [yaml.safe_load((r / "config.yaml").read_text())["output_dir"] for r in runs]
    assert sorted(Path(d).resolve() for d in saved) == runs  # each run says where it went
    # an explicit output_dir keeps today's refusal and --resume
    with pytest.raises(ConfigError, match="already holds an evaluation"):
        main([*args, "num_episodes=2", f"output_dir={runs[0]}"])
    resumed = main([*args, "num_episodes=4", f"output_dir={runs[0]}", "--resume"])
    assert resumed["episodes"] == 4 and len(list((tmp_path / "outputs" / "eval").glob("*/*"))) == 2
    with pytest.raises(ConfigError, match=r"--resume.*give its output_dir"):
        main([*args, "--resume"])


def test_two_runs_started_in_the_same_second_never_share_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from areal_agents.eval import EvalConfig, new_output_dir

    monkeypatch.chdir(tmp_path)
    cfg = EvalConfig(env="acme/MyTask-v0", policy=EvalPolicyConfig(model="/models/My Model"))
    named = new_output_dir(cfg, create=False, now=1e9)  # what --check says: the first free one
    assert named == new_output_dir(cfg, create=False, now=1e9) and not named.exists()
    made: list[Path] = []
    start = threading.Barrier(8)

    def one() -> None:
        start.wait()
        made.append(new_output_dir(cfg, now=1e9))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 8 and all(p.is_dir() for p in made)
    assert named in made and named.name.endswith("_acme-MyTask-v0_My-Model")
    assert {p.name for p in made} == {named.name, *(f"{named.name}_{n}" for n in range(2, 9))}
    assert new_output_dir(cfg, create=False, now=1e9).name == f"{named.name}_9"


def test_check_without_an_output_dir_names_the_folder_and_makes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["--check", "policy.model=x"]) == {}
    out = capsys.readouterr().out
    assert re.search(r"results would go to outputs/eval/\S+/\S+_calculator_x \(a new folder\)", out)
    assert not list(tmp_path.iterdir())
