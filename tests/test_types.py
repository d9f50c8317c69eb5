"""The data contracts: round trips to the OpenAI format, validation, trajectories from turns."""

from __future__ import annotations

import pytest

from areal_agents.types import Message, ToolCall, ToolSpec, Trajectory, Turn


def test_message_round_trip_keeps_tool_calls_and_ids() -> None:
    call = ToolCall(name="python", arguments='{"code": "print(1)"}', id="call_7")
    msg = Message.assistant("running", tool_calls=[call])
    data = msg.to_openai()
    assert data == {
        "role": "assistant",
        "content": "running",
        "tool_calls": [
            {
                "id": "call_7",
                "type": "function",
                "function": {"name": "python", "arguments": '{"code": "print(1)"}'},
            }
        ],
    }
    assert Message.from_openai(data) == msg
    tool_msg = Message.tool("1\n", tool_call_id="call_7", name="python")
    assert Message.from_openai(tool_msg.to_openai()) == tool_msg


def test_message_rejects_unknown_role_and_keeps_turn_out_of_the_wire() -> None:
    with pytest.raises(ValueError, match="unknown role"):
        Message("robot", "hi")  # type: ignore[arg-type]
    turn = Turn(
        "hi", id="t1", completion_ids=(1, 2), behavior_logprobs=(-0.1, -0.2), versions=(0, 0)
    )
    msg = Message.from_turn(turn)
    assert msg.turn_id == "t1" and msg == Message.assistant("hi")  # provenance, not content
    assert not any("turn" in key for key in msg.to_openai())


def test_tool_call_arguments_parse_lazily() -> None:
    assert ToolCall("f", '{"a": 1}').parsed_arguments() == {"a": 1}
    assert ToolCall("f", "").parsed_arguments() == {}
    with pytest.raises(ValueError):
        ToolCall("f", "[1, 2]").parsed_arguments()
    with pytest.raises(ValueError):
        ToolCall("f", "{oops").parsed_arguments()
    # structured calls whose arguments arrive as a dict are normalised to JSON text
    call = ToolCall.from_openai({"id": "x", "function": {"name": "f", "arguments": {"a": 2}}})
    assert call.parsed_arguments() == {"a": 2}


def test_tool_spec_validates_and_round_trips() -> None:
    spec = ToolSpec("search", "Look things up.", {"type": "object", "properties": {}})
    assert ToolSpec.from_openai(spec.to_openai()) == spec
    with pytest.raises(ValueError, match="name"):
        ToolSpec("bad name!", "x")
    with pytest.raises(ValueError, match="object"):
        ToolSpec("f", "x", {"type": "string"})


def test_turn_checks_token_field_lengths() -> None:
    with pytest.raises(ValueError, match="behavior_logprobs"):
        Turn(text="x", completion_ids=(1, 2), behavior_logprobs=(-0.1,))
    with pytest.raises(ValueError, match="versions"):
        Turn(text="x", versions=(1,))
    assert (
        Turn(text="x", completion_ids=(1, 2), behavior_logprobs=(0.0, 0.0), versions=(3, 4)).version
        == 4
    )


def _turn(prompt: tuple[int, ...], gen: tuple[int, ...], version: int) -> Turn:
    return Turn(
        text="",
        prompt_ids=prompt,
        completion_ids=gen,
        behavior_logprobs=tuple(-0.5 for _ in gen),
        versions=tuple(version for _ in gen),
    )


def test_trajectory_from_turns_masks_only_policy_tokens() -> None:
    t1 = _turn((1, 2, 3), (10, 11), version=0)
    # second prompt = first prompt + generated + two tool tokens (20, 21)
    t2 = _turn((1, 2, 3, 10, 11, 20, 21), (12,), version=1)
    traj = Trajectory.from_turns([t1, t2], reward=1.0, group_id="g", task_id="t")
    assert traj.sequence_ids == (1, 2, 3, 10, 11, 20, 21, 12)
    assert traj.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1)
    assert traj.versions == (-1, -1, -1, 0, 0, -1, -1, 1)
    assert traj.behavior_logprobs[3] == -0.5 and traj.behavior_logprobs[5] == 0.0
    assert traj.num_policy_tokens == 3
    assert traj.min_version == 0
    assert traj.num_turns == 2


def test_trajectory_from_turns_rejects_drift_and_missing_tokens() -> None:
    t1 = _turn((1, 2), (10,), version=0)
    drifted = _turn((1, 2, 99, 20), (12,), version=0)  # 99 != 10: re-tokenisation drift
    with pytest.raises(ValueError, match="extend"):
        Trajectory.from_turns([t1, drifted], reward=0.0, group_id="g")
    with pytest.raises(ValueError, match="token"):
        Trajectory.from_turns([Turn(text="no tokens")], reward=0.0, group_id="g")
    with pytest.raises(ValueError, match="at least one"):
        Trajectory.from_turns([], reward=0.0, group_id="g")


def test_trajectory_validates_lengths_and_mask_values() -> None:
    with pytest.raises(ValueError, match="loss_mask"):
        Trajectory((1, 2), (1,), (0.0, 0.0), (0, 0), 1.0, "g")
    with pytest.raises(ValueError, match="0 and 1"):
        Trajectory((1,), (2,), (0.0,), (0,), 1.0, "g")
