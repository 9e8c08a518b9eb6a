"""The gateway's recorded values (sqlrl.gateway.trace): checked at construction, JSON round trip."""

from __future__ import annotations

import json

import pytest

from sqlrl.gateway.trace import LostReason, RolloutTrace, TracedCall


def _call(i: int, rid: str = "r1", n: int = 2) -> TracedCall:
    return TracedCall(rollout_id=rid, index=i, tag="write" if i == 0 else None, prompt_ids=(1, 2, 3),
                      response_ids=tuple(range(10, 10 + n)), logprobs=tuple(-0.5 for _ in range(n)),
                      versions=tuple(3 for _ in range(n)), finish_reason="stop")


def test_round_trip_through_json_is_exact():
    trace = RolloutTrace("r1", "t1", "g1", (_call(0), _call(1)), "completed", reward=1.0,
                         reward_source="judge", reward_parts={"ex": 1.0}, final_sql="SELECT 1", n_incomplete=1)
    assert RolloutTrace.from_dict(json.loads(json.dumps(trace.to_dict()))) == trace
    lost = RolloutTrace("r2", "t1", "g1", (), "expired", lost=LostReason.GATEWAY_RESTART)
    assert json.loads(json.dumps(lost.to_dict()))["lost"] == "gateway-restart"
    assert RolloutTrace.from_dict(json.loads(json.dumps(lost.to_dict()))).lost is LostReason.GATEWAY_RESTART


@pytest.mark.parametrize("kwargs, message", [
    ({"logprobs": (-0.1,)}, "same length"),
    ({"versions": ()}, "same length"),
    ({"prompt_ids": ()}, "non-empty prompt"),
    ({"index": -1}, "index >= 0"),
])
def test_call_rejects_inconsistent_values(kwargs, message):
    base = _call(0).to_dict() | {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=message):
        TracedCall.from_dict(base)


@pytest.mark.parametrize("kwargs, message", [
    ({"status": "done", "reward": None}, "status"),
    ({"reward_source": "forged"}, "reward_source"),
    ({"reward": None}, "exactly when it completed"),
    ({"status": "expired"}, "exactly when it completed"),
    ({"calls": (_call(1),)}, "in order"),
    ({"calls": (_call(0, rid="other"),)}, "belong to this rollout"),
    ({"lost": LostReason.GATEWAY_RESTART}, "a lost rollout ends expired"),
    ({"lost": "nope", "status": "expired", "reward": None}, "not a valid LostReason"),
])
def test_rollout_rejects_inconsistent_values(kwargs, message):
    args = {"rollout_id": "r1", "task_id": "t", "group_id": "g", "calls": (_call(0),), "status": "completed",
            "reward": 0.0, "reward_source": "judge"} | kwargs
    with pytest.raises(ValueError, match=message):
        RolloutTrace(**args)
