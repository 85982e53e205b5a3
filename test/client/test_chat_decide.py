"""sequence_ai.chat() / decide() against a real OpenAI-compatible server on loopback.

The server is llama.cpp's, from ``llama-cpp-python[server]`` (the test extra), serving a tiny
GGUF model this module builds (test/_tiny_gguf.py): its next-token distribution is fixed by
construction, so the probabilities decide() reports are checked against numbers computed here,
and function calling (llama.cpp's ``chatml-function-calling`` grammar) gives a known call. The
model plans nothing; what is tested is the mechanics: the requests, the tool-call round trip,
the log-probability scoring, and the typed errors of a refused request and of a server that is
down.
"""
from __future__ import annotations

import json
import math

import pytest

import sequence_ai
from sequence_ai import InvalidRequest, SequencesError, Unavailable

import _tiny_gguf
from _llm import CHAT_MODEL, SCORE_MODEL, free_port, llm  # noqa: F401  (the llama.cpp server fixture)

ACT_TOOL = {"type": "function", "function": {
    "name": "act", "description": "drive the robot for one instruction",
    "parameters": {"type": "object", "properties": {"instruction": {"type": "string"},
                                                    "max_seconds": {"type": "number"}},
                   "required": ["instruction", "max_seconds"]}}}


def test_chat_returns_the_reply_without_a_choices_wrapper(llm):
    # temperature 0 (greedy) and repeat_penalty (a llama.cpp parameter, passed through) make the
    # fixed model's reply exact: its favourite token, max_tokens times
    r = sequence_ai.chat(SCORE_MODEL, [{"role": "user", "content": "what should the arm do?"}],
                         base_url=llm, max_tokens=8, temperature=0.0, repeat_penalty=1.0)
    assert r.content == '"' * 8 and r.tool_calls is None
    assert r.finish_reason == "length"
    assert r.usage["prompt_tokens"] > 10 and r.usage["completion_tokens"] == 8
    assert r.model == SCORE_MODEL
    assert r.cost_usd is None                              # a local server, no prices configured
    priced = sequence_ai.chat(SCORE_MODEL, [{"role": "user", "content": "hi"}], base_url=llm, max_tokens=4,
                              temperature=0.0, prices=(2.0, 8.0))
    assert priced.cost_usd == pytest.approx((2.0 * priced.usage["prompt_tokens"]
                                             + 8.0 * priced.usage["completion_tokens"]) / 1e6)


def test_tool_call_round_trip(llm, monkeypatch):
    monkeypatch.setenv("SEQUENCES_CHAT_BASE_URL", llm)    # the endpoint from the environment
    messages = [{"role": "system", "content": "You drive a robot with the act tool."},
                {"role": "user", "content": "put the red cube on the green pad"}]
    r = sequence_ai.chat(CHAT_MODEL, messages, tools=[ACT_TOOL], temperature=0.0, repeat_penalty=1.0,
                         tool_choice={"type": "function", "function": {"name": "act"}}, max_tokens=64)
    assert r.finish_reason == "tool_calls" and not r.content
    assert len(r.tool_calls) == 1
    call = r.tool_calls[0]
    assert call.name == "act" and call.id
    # what the schema's grammar and the model's fixed preferences give: an empty string, then 3
    assert call.arguments == {"instruction": "", "max_seconds": 3}
    assert json.loads(call.raw_arguments) == call.arguments
    # the round trip: the assistant's tool call and the tool's result go back; the endpoint takes
    # both (llama.cpp's chatml-function-calling template renders the call into the prompt -- more
    # prompt tokens than the same conversation without it -- and drops tool messages)
    assert r.message["tool_calls"][0]["function"] == {"name": "act", "arguments": call.raw_arguments}
    assert r.message["content"] == ""
    turn = [r.message, {"role": "tool", "tool_call_id": call.id,
                        "content": json.dumps({"status": "SUCCEEDED", "outcome": {"reason": "until"}})}]
    r2 = sequence_ai.chat(CHAT_MODEL, messages + turn, tools=[ACT_TOOL], tool_choice="none", max_tokens=4,
                          temperature=0.0)
    without = sequence_ai.chat(CHAT_MODEL, messages, tools=[ACT_TOOL], tool_choice="none", max_tokens=4,
                               temperature=0.0)
    assert r2.tool_calls is None and isinstance(r2.content, str)
    assert r2.usage["prompt_tokens"] >= without.usage["prompt_tokens"] + len(call.raw_arguments)


def test_decide_scores_from_token_logprobs(llm):
    result = sequence_ai.decide(SCORE_MODEL, {"cube": "red", "on_pad": "green"}, {
        "placed": {"type": "noul", "instructions": "Is the red cube on the green pad?",
                   "criteria": {"true": "it is", "false": "it is not"}},
        "next": {"type": "choice", "instructions": "What next?",
                 "criteria": {"blue_on_red": "blue cube on the red pad", "done": "stop",
                              "retry": "do it again"}},
        "grasp": {"type": "score", "instructions": "How good was the grasp?",
                  "criteria": {"poor": "slipped", "fair": "held", "good": "firm", "perfect": "centred"}},
    }, base_url=llm)
    a = result.answers
    p_true, _ = _tiny_gguf.label_probabilities(["A", "B"])
    assert a["placed"]["type"] == "noul"
    assert a["placed"]["noul"] == pytest.approx(p_true, abs=1e-3)          # e^3 / (e^3 + e^2) = 0.731
    assert a["placed"]["confidence"] == pytest.approx(p_true, abs=1e-3)
    assert a["placed"]["coverage"] == pytest.approx(_tiny_gguf.label_mass(["A", "B"]), abs=1e-3)
    dist = _tiny_gguf.label_probabilities(["A", "B", "C"])
    assert a["next"]["choice"] == "blue_on_red" and a["next"]["confidence"] == pytest.approx(dist[0], abs=1e-3)
    assert a["next"]["distribution"] == pytest.approx(dict(zip(["blue_on_red", "done", "retry"], dist)), abs=1e-3)
    levels = _tiny_gguf.label_probabilities(["A", "B", "C", "D"])
    assert a["grasp"]["level"] == "poor"
    assert a["grasp"]["score"] == pytest.approx(sum(i * p for i, p in enumerate(levels)) / 3, abs=1e-3)
    assert math.isclose(sum(a["grasp"]["distribution"].values()), 1.0, abs_tol=1e-9)
    assert result.usage["completion_tokens"] == 3 and result.usage["prompt_tokens"] > 100
    assert result.cost_usd is None
    priced = sequence_ai.decide(SCORE_MODEL, "x", {"q": {"type": "noul", "instructions": "?"}}, base_url=llm,
                                prices=(1.0, 100.0))
    assert priced.cost_usd == pytest.approx(priced.usage["prompt_tokens"] / 1e6)   # input tokens only


def test_decide_refuses_an_unknown_question_type_before_any_request():
    with pytest.raises(ValueError, match="noul"):
        sequence_ai.decide("m", "s", {"q": {"type": "yesno"}}, base_url="http://127.0.0.1:9/v1")


def test_a_refused_request_is_invalid_request_in_the_providers_words(llm):
    # a prompt longer than the model's context (8192 tokens; one character is one token here)
    with pytest.raises(InvalidRequest) as err:
        sequence_ai.chat(SCORE_MODEL, [{"role": "user", "content": "x" * 9000}], base_url=llm, max_tokens=1)
    e = err.value
    assert e.code == "provider_rejected" and e.status_code == 400 and not e.retryable
    assert "context" in str(e) and "8192" in str(e)          # the provider's own words
    assert not isinstance(e, Unavailable)


def test_a_server_that_is_down_is_unavailable():
    port = free_port()                                       # nothing listens there
    with pytest.raises(Unavailable) as err:
        sequence_ai.chat("m", [{"role": "user", "content": "hi"}], base_url=f"http://127.0.0.1:{port}/v1",
                         timeout_s=5)
    assert err.value.code == "provider_unreachable" and err.value.warming is False
    assert f"127.0.0.1:{port}" in str(err.value)
    with pytest.raises(Unavailable):
        sequence_ai.decide("m", "s", {"q": {"type": "noul", "instructions": "?"}},
                           base_url=f"http://127.0.0.1:{port}/v1", timeout_s=5)
    assert issubclass(Unavailable, SequencesError)


def test_no_endpoint_configured_says_how(monkeypatch):
    monkeypatch.delenv("SEQUENCES_CHAT_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="SEQUENCES_CHAT_BASE_URL"):
        sequence_ai.chat("m", [{"role": "user", "content": "hi"}])
