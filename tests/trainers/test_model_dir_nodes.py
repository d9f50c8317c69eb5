"""A model with a run-specific chat template reaches other nodes without the run directory:
they get the model's own directory and the template, and build the view on their own disk."""

from __future__ import annotations

import shutil
from pathlib import Path

from transformers import AutoTokenizer

from areal_agents.trainers.modeling import model_source, node_model_dir, with_chat_template

TEMPLATE = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"


def test_the_view_in_the_run_dir_is_rebuilt_on_each_node_from_the_model_and_template(
    model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    view = with_chat_template(model_dir, TEMPLATE, run_dir / "model")
    base, template = model_source(view)
    assert base == model_dir.resolve() and template == TEMPLATE
    shutil.rmtree(run_dir)  # another node: the driver's run directory is not there
    local = node_model_dir(str(base), template)
    assert run_dir not in local.parents and local.is_dir()
    assert node_model_dir(str(base), template) == local  # built once per model and template
    tokenizer = AutoTokenizer.from_pretrained(str(local))
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered == "<<hi>>"
    assert node_model_dir(str(base), TEMPLATE + " ") != local  # another template, another view


def test_a_plain_model_directory_travels_as_it_is(model_dir: Path) -> None:
    assert model_source(model_dir) == (model_dir, None)
    assert node_model_dir(str(model_dir), None) == model_dir
