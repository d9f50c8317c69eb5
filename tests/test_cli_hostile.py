"""The command lines against hostile input (the red team's round 3, ``c1_cli.py``, as tests).

Each attack must end in a clear ``error:`` (exit status 2), fast, without a traceback, without
quoting a file that is not a config file, without resolving the environment into a value, and
without creating anything. The commands run in this process (``main(argv)``) under a deadline
(:func:`deadline`), so an attack that used to hang fails its test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_agents.errors import ConfigError, brief, shorten

SECRET = "S3CRET-d41d8cd9"
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)  # 9**9 = 387 million values in 500 bytes
FILES = {
    "bomb.yaml": BOMB,
    "bomb_in_key.yaml": BOMB.rsplit("\n", 3)[0] + "\nenv:\n  kwargs:\n    system_prompt: *g\n",
    "deep.yaml": "x: " + "[" * 5000 + "]" * 5000 + "\n",
    "shadow": f"root:$6${SECRET}:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",
    "environ": f"HOME=/root\0AWS_SECRET_ACCESS_KEY={SECRET}\0",
    "notutf8.yaml": "seed: \udcff\udcfe\n",  # written with surrogateescape: bytes ff fe
    "list.yaml": "- a\n- b\n",
    "pyobj.yaml": "trainer: !!python/object/apply:os.system ['touch PWNED']\n",
    "tag_custom.yaml": "output_dir: !custom x\n",
    "interp.yaml": "output_dir: ${oc.env:HOME}/x\n",
    "interp_nested.yaml": "env:\n  kwargs:\n    system_prompt: 'key ${oc.env:PATH}'\n",
    "interp_loop.yaml": "output_dir: ${output_dir}\n",
    "dupkeys.yaml": "trainer:\n  seed: 1\n  seed: 2\n",
    "big.yaml": "# padding\n" * 200_000,
    "pyname.yaml": "env: !!python/name:os.system\n",
    "merge_key.yaml": "base: &b {seed: 3}\n<<: *b\n",
}
#: (the arguments, what the error must say)
ATTACKS = [
    (["config=bomb.yaml"], "more than 100000 values"),
    (["config=bomb_in_key.yaml"], "more than 100000 values"),
    (["config=deep.yaml"], "nested too deeply"),
    (["config=shadow"], "not a config file"),
    (["config=environ"], "not valid YAML"),
    (["config=notutf8.yaml"], "not UTF-8 text"),
    (["config=list.yaml"], "must hold a mapping"),
    (["config=pyobj.yaml"], "not valid YAML"),
    (["config=tag_custom.yaml"], "not valid YAML"),
    (["config=zero.yaml"], "not a regular file"),
    (["config=big.yaml"], "larger than 1 MiB"),
    (["config=interp.yaml"], "${oc.env:...} is not allowed"),
    (["config=interp_nested.yaml"], "env.kwargs.system_prompt: ${oc.env:...} is not allowed"),
    (["config=interp_loop.yaml"], "output_dir: Recursive interpolation"),
    (["config=dupkeys.yaml"], "line 3, column 3: seed is given twice"),
    (["output_dir=" + "x" * 5000], "(5000 characters): cannot write there (File name too long)"),
    (["model=" + "x" * 5000], "model=xxxxxxxxxx" + "x" * 110 + "... (5000 characters): File name"),
    (["model=/a/" + "x" * 5000 + "/b"], "model=/a/" + "x" * 117 + "... (5005 characters): File"),
    (["algo=" + "x" * 5000], "x... (5007 characters) is not a known algorithm; choose one"),
    (["inference.engine=" + "x" * 5000], "x... (5019 characters) is not a known engine"),
    (["trainer.optimizer=" + "x" * 5000], "x... (5020 characters) is not allowed; choose"),
    (["env.group_size=" + "x" * 5000], "env.group_size: expected an integer, got 'xxx"),
    (["output_dir=${oc.env:HOME}"], "output_dir: ${oc.env:...} is not allowed"),
    (["output_dir=${oc.env:AWS_SECRET_ACCESS_KEY}"], "${oc.env:...} is not allowed"),
    (["output_dir=${oc.decode:'!!python/object/apply:os.system [\"id\"]'}"], "oc.decode"),
    (["trainer.seed=${oc.decode:'" + "[" * 3000 + "'}"], "oc.decode"),
    (["hydra.run.dir=${oc.env:HOME}"], "${oc.env:...} is not allowed"),
    (["--multirun", "trainer.seed=range(0,100000)"], "the sweep has 100000 jobs"),
    (
        ["-m", "trainer.seed=range(0,100)", "algo=grpo,rloo,rloo"],
        "300 jobs (100 trainer.seed x 3 algo)",
    ),
]


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise in this thread if the block runs longer than ``seconds`` (SIGALRM)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding the attack files (and, after a run, nothing else)."""
    here = tmp_path / "cwd"
    here.mkdir()
    for name, text in FILES.items():
        (here / name).write_text(text, errors="surrogateescape")
    (here / "shadow").chmod(0o600)
    (here / "zero.yaml").symlink_to("/dev/zero")
    monkeypatch.chdir(here)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    return here


@pytest.mark.parametrize(("args", "says"), ATTACKS, ids=[" ".join(a)[:40] for a, _ in ATTACKS])
def test_train_check_refuses_at_once_naming_the_problem(
    cwd: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    from areal_agents.train import main

    before = sorted(p.name for p in cwd.iterdir())
    with deadline(60), pytest.raises(SystemExit) as e:
        main(["--check", "env=calculator", "model=tiny", *args])
    out, err = capsys.readouterr()
    assert e.value.code == 2, out[-2000:]
    assert err.startswith("error: ") and says in err, err
    assert "Traceback" not in err and SECRET not in out + err and "/root" not in err
    assert len(err) < 600  # one line, not the file or the 5000 characters
    assert sorted(p.name for p in cwd.iterdir()) == before  # nothing created


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["config=bomb.yaml"], "more than 100000 values"),
        (["config=shadow"], "not a config file"),
        (["config=environ"], "not valid YAML"),
        (["output_dir=" + "y" * 5000], "(5000 characters): cannot write there"),
        (["output_dir=${oc.env:HOME}"], "${oc.env:...} is not allowed"),
        (["--multirun", "seed=range(0,100000)"], "the sweep has 100000 jobs"),
    ],
    ids=["bomb", "shadow", "environ", "long output_dir", "oc.env", "huge sweep"],
)
def test_eval_check_refuses_at_once_naming_the_problem(
    cwd: Path, args: list[str], says: str
) -> None:
    from areal_agents.eval import main

    with deadline(60), pytest.raises(ConfigError) as e:
        main(["--check", "env=calculator", *args])
    assert says in str(e.value) and SECRET not in str(e.value)
    assert sorted(p.name for p in cwd.iterdir()) == sorted([*FILES, "zero.yaml"])


def test_a_sweep_within_the_limit_and_plain_interpolations_still_work(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from areal_agents.eval import main

    main(
        [
            "--check",
            "-m",
            "seed=range(0,3)",
            "env=calculator",
            "output_dir=out/${seed}-${hydra:job.num}",
        ]
    )
    out = capsys.readouterr().out
    assert out.count("configuration OK") == 3 and "results would go to out/2-2" in out
    (cwd / "ok.yaml").write_text("num_episodes: 4\nsamples_per_task: 2\noutput_dir: r/${seed}\n")
    main(["--check", "config=ok.yaml", "env=calculator", "seed=7"])
    assert "results would go to r/7" in capsys.readouterr().out


#: c1's other attacks: (the arguments after ``--check model=tiny``, what the error must say)
MORE_TRAIN_ATTACKS = [
    (["env=calculator", "config=pyname.yaml"], "not valid YAML"),
    (["env=calculator", "config=merge_key.yaml"], "unknown config key"),
    (["env=calculator", "config=."], "config=.: not a regular file"),
    (["env=calculator", "output_dir=/dev/null"], "cannot write there"),
    (["env=calculator", "output_dir=/proc/self/fd"], "cannot write there"),
    (["env=calculator", "trainer.seed=" + "9" * 5000], "4300 digits"),
    (
        ["env=calculator", "trainer.seed=!!python/object/apply:os.system ['touch PWNED']"],
        "key=value",
    ),
    (["env=calculator", "env.kwargs={bogus: 1}"], "unknown option 'bogus'"),
    (["env=code_sandbox", "env.kwargs={sandbox_backend: none}"], "sandbox_backend='none'"),
    (["env=code_sandbox", "env.kwargs={sandbox_options: {memory_mb: -1}}"], "memory_mb=-1"),
    (["env=code_sandbox", "env.kwargs={path: shadow, source: jsonl}"], "shadow:1: not valid JSON"),
    (["env=math_python", "env.kwargs={verify_timeout_s: .nan}"], "verify_timeout_s"),
    (["env=remote:file:///etc/passwd"], "is not a remote environment"),
    (["env=os:system"], "doesn't exist"),
]


@pytest.mark.parametrize(
    ("args", "says"), MORE_TRAIN_ATTACKS, ids=[" ".join(a)[:50] for a, _ in MORE_TRAIN_ATTACKS]
)
def test_train_check_refuses_the_other_c1_attacks(
    cwd: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    """The rest of ``c1_cli.py``'s train attacks: files that are not configs, places that cannot
    be written, numbers and tags that are not values, and options an environment refuses."""
    from areal_agents.train import main

    before = sorted(p.name for p in cwd.iterdir())
    with deadline(60), pytest.raises(SystemExit) as e:
        main(["--check", "model=tiny", *args])
    out, err = capsys.readouterr()
    assert e.value.code == 2, out[-2000:]
    assert err.startswith("error: ") and says in err, err
    assert "Traceback" not in err and SECRET not in out + err
    assert sorted(p.name for p in cwd.iterdir()) == before and not Path("PWNED").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["seed=1e999"], "seed: expected an integer"),
        (["env_kwargs={max_turns: -3}"], "max_turns=-3"),
        (["num_episodes=-1"], "num_episodes=-1"),
        (["concurrency=0"], "concurrency=0"),
        (["config=pyname.yaml"], "not valid YAML"),
        (["output_dir=/dev/null"], "cannot write there"),
    ],
    ids=["seed inf", "max_turns", "num_episodes", "concurrency", "python tag", "/dev/null"],
)
def test_eval_check_refuses_the_other_c1_attacks(cwd: Path, args: list[str], says: str) -> None:
    from areal_agents.eval import main

    with deadline(60), pytest.raises(ConfigError) as e:
        main(["--check", "env=calculator", *args])
    assert says in str(e.value) and SECRET not in str(e.value)
    assert sorted(p.name for p in cwd.iterdir()) == sorted([*FILES, "zero.yaml"])


def test_eval_refusal_names_a_long_value_without_echoing_it(cwd: Path) -> None:
    """The printed refusal shortens whatever value the check quoted (``errors.brief``): the
    command line's ``error:`` line, not only the exception, stays one short line."""
    value = "x" * 5000
    done = subprocess.run(
        [sys.executable, "-m", "areal_agents.eval", "--check", f"env={value}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("error: unknown environment 'xxx")
    assert "... (5003 characters) known short names" in done.stderr
    assert len(done.stderr) < 600 and "Traceback" not in done.stderr


def test_brief_shortens_each_long_word_once() -> None:
    word = "y" * 300
    assert brief(f"a '{word}' b") == f"a {shorten(repr(word), 120)} b"
    assert brief("short words stay") == "short words stay"
    # a message that shortened its value itself is not cut twice
    assert brief(f"key={shorten('z' * 300)} end") == f"key={shorten('z' * 300)} end"
