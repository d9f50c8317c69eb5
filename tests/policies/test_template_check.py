"""The chat-template gate: a template that rewrites earlier turns is refused at start-up, with
the key to change and the training-safe templates, before Ray or a server starts.

The failing templates are real: a small Jinja template written here that drops the ``<think>``
blocks of earlier assistant turns, and Qwen3's template as TRL bundles it (it does the same).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from areal_agents.errors import ConfigError
from areal_agents.policies.template_check import (
    PROBE_DIALOGUE,
    PROBE_TOOLS,
    check_chat_template,
    prefix_violation,
    resolve_chat_template,
)
from areal_agents.policies.templates import continuation_ids, render_prompt_ids, tool_chat_template

#: ChatML with tools, which keeps ``<think>`` only in the last assistant turn (as Qwen3 does).
THINK_DROPPING = r"""
{%- if tools %}<|im_start|>system
Tools:{% for tool in tools %} {{ tool['function']['name'] }}{% endfor %}<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- set content = m['content'] -%}
{%- if m['role'] == 'assistant' and not loop.last and '</think>' in content -%}
{%- set content = content.split('</think>')[-1].lstrip() -%}
{%- endif -%}
<|im_start|>{{ m['role'] }}
{{ content }}
{%- for call in m.get('tool_calls') or [] %}
<tool_call>{{ call['function']['name'] }} {{ call['function']['arguments'] }}</tool_call>
{%- endfor %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""


@pytest.fixture(scope="module")
def tok(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_the_default_models_template_passes(tok: Any) -> None:
    template = check_chat_template(tok, None, "default")
    assert template == tool_chat_template()  # what every engine renders with
    assert check_chat_template(tok, "chatml_tools", "default") == template


def test_a_template_that_drops_earlier_thinking_is_refused_with_the_fix(
    tok: Any, tmp_path: Path
) -> None:
    path = tmp_path / "drops_think.jinja"
    path.write_text(THINK_DROPPING)
    problem = prefix_violation(tok, THINK_DROPPING)
    assert problem is not None and "<think>" in problem
    with pytest.raises(ConfigError) as e:
        check_chat_template(tok, str(path), "default")
    message = str(e.value)
    assert message.startswith("model.chat_template: ")
    assert "not prefix-preserving" in message and "model.chat_template=chatml_tools" in message
    # the check is what the token client would have hit mid-run: the same conversation fails there
    own, tok.chat_template = tok.chat_template, THINK_DROPPING
    try:
        with pytest.raises(ConfigError, match="not prefix-preserving"):
            continuation_ids(
                tok,
                PROBE_DIALOGUE[:5],
                PROBE_DIALOGUE[5:6],
                PROBE_TOOLS,
                sampled_ids=render_prompt_ids(
                    tok, PROBE_DIALOGUE[4:5], add_generation_prompt=False
                ),
            )
    finally:
        tok.chat_template = own


def test_qwen3s_template_fails_and_trls_training_version_is_offered(tok: Any) -> None:
    from trl.chat_template_utils import qwen3_chat_template, qwen3_training_chat_template

    own = tok.chat_template
    tok.chat_template = qwen3_chat_template  # a model whose own template is Qwen3's
    try:
        with pytest.raises(ConfigError) as e:
            check_chat_template(tok, None, "qwen3-like")
        assert "model.chat_template=trl" in str(e.value)
        assert resolve_chat_template(tok, "trl") == qwen3_training_chat_template
        assert check_chat_template(tok, "trl", "qwen3-like") == qwen3_training_chat_template
        assert check_chat_template(tok, "chatml_tools", "qwen3-like") == tool_chat_template()
    finally:
        tok.chat_template = own


def test_unknown_choices_name_the_key(tok: Any) -> None:
    with pytest.raises(ConfigError, match=r"^model\.chat_template: 'nope' is not chatml_tools"):
        resolve_chat_template(tok, "nope")


def test_the_key_changes_what_every_engine_renders(tmp_path: Path) -> None:
    """``model.chat_template`` is applied through ``<run>/model``: the tokenizer any engine
    loads from there renders with the chosen template, the original directory is untouched."""
    from transformers import AutoTokenizer

    from areal_agents.trainers.config import ModelConfig
    from areal_agents.trainers.modeling import (
        prepare_model_dir,
        tiny_model_path,
        with_chat_template,
    )

    # a model whose own template drops earlier thinking: the default key refuses it
    bad = with_chat_template(tiny_model_path(), THINK_DROPPING, tmp_path / "bad-model")
    assert AutoTokenizer.from_pretrained(bad).chat_template == THINK_DROPPING
    with pytest.raises(ConfigError, match=r"model\.chat_template"):
        prepare_model_dir(ModelConfig(name=str(bad)), tmp_path / "run0")
    # model.chat_template=chatml_tools makes the same model usable, through <run>/model
    used = prepare_model_dir(
        ModelConfig(name=str(bad), chat_template="chatml_tools"), tmp_path / "run1"
    )
    assert used == tmp_path / "run1" / "model"
    tokenizer = AutoTokenizer.from_pretrained(used)
    assert tokenizer.chat_template == tool_chat_template()
    assert prefix_violation(tokenizer, tokenizer.chat_template) is None
    assert (used / "model.safetensors").resolve() == (tiny_model_path() / "model.safetensors")
    assert AutoTokenizer.from_pretrained(bad).chat_template == THINK_DROPPING  # left alone
    # the default key uses the model directory as it is
    assert prepare_model_dir(ModelConfig(name="tiny"), tmp_path / "run2") == tiny_model_path()


def test_train_refuses_it_before_ray_or_a_server_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    import areal_agents.trainers.loop as loop
    from areal_agents.config import load_config
    from areal_agents.train import main
    from areal_agents.trainers.config import TrainConfig

    path = tmp_path / "drops_think.jinja"
    path.write_text(THINK_DROPPING)
    args = ["env=calculator", "model=tiny", f"model.chat_template={path}", f"output_dir={tmp_path}"]
    with pytest.raises(SystemExit) as e:
        main([*args, "log.progress=false"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.match(r"error: model\.chat_template: '.*drops_think\.jinja' chat template", err)
    assert "chatml_tools" in err and "Traceback" not in err
    assert not ray.is_initialized()

    started: list[str] = []  # train() called directly gates the same way, before Ray
    monkeypatch.setattr(loop, "start_ray", lambda *a, **k: started.append("ray"))
    monkeypatch.setattr(loop, "start_servers", lambda *a, **k: started.append("servers"))
    with pytest.raises(ConfigError, match=r"model\.chat_template"):
        loop.train(load_config(TrainConfig, args))
    assert started == []
