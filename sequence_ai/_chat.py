"""chat() and decide(): one-shot calls to a language model on an OpenAI-compatible endpoint.

The slow brain beside the control loop: ``chat()`` is a sentence in, a sentence or a tool call
out; ``decide()`` scores typed questions about a state and returns probabilities read from the
model's token log-probabilities (it scores, it does not generate text to parse). Both are plain
``httpx`` requests to ``POST {base_url}/chat/completions`` -- a local server (llama.cpp's, vLLM's,
Ollama's) or a provider -- so the robot client gains no SDK.

Configuration, each argument first, then the environment:

* ``base_url`` / ``$SEQUENCES_CHAT_BASE_URL``: the endpoint's ``/v1`` root, e.g.
  ``http://127.0.0.1:8080/v1``. Required (there is no default provider).
* ``api_key`` / ``$SEQUENCES_CHAT_API_KEY``: sent as ``Authorization: Bearer``; none for a local
  server that takes none. Keep it as a ``seq secret`` (``seq secret set llm --env
  SEQUENCES_CHAT_API_KEY``): code the gateway runs (a policy or benchmark declaring
  ``seq.Secret.from_name("llm")``) gets it in its environment; a robot process sets the
  variable from its own secret store. The value is never logged or put in an error.
* ``prices`` / ``$SEQUENCES_CHAT_PRICES`` (``"IN,OUT"`` USD per million tokens): what
  ``cost_usd`` is computed from when the provider does not report a cost itself.

Errors (all ``SequencesError``): a request the provider refuses (4xx but 429) raises
``InvalidRequest`` in the provider's own words (code ``provider_rejected``; 401/403:
``provider_unauthorized``); a provider error (5xx), a rate limit (429, ``retry_after_s`` from
``Retry-After``), an endpoint that cannot be reached or times out, or an answer that is not
the OpenAI shape raises ``Unavailable`` (``warming=False``: the provider failed, it is not
loading). ``ValueError`` is raised locally for a malformed call (no base URL, a question type
that does not exist).
"""
from __future__ import annotations

import json
import math
import os
import string
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from sequence_ai_core import InvalidRequest, Unavailable

__all__ = ["chat", "decide", "ChatResult", "DecideResult", "ToolCall", "QUESTION_TYPES"]

BASE_URL_ENV = "SEQUENCES_CHAT_BASE_URL"
API_KEY_ENV = "SEQUENCES_CHAT_API_KEY"
PRICES_ENV = "SEQUENCES_CHAT_PRICES"

#: decide()'s question types and the criteria each needs.
QUESTION_TYPES = {
    "noul": 'a yes/no question: criteria {"true": what makes it true, "false": what makes it false}; '
            'the answer is "noul": P(true) in 0..1',
    "choice": 'pick one of the options you name: criteria {option: description, ...} (2..26 options); '
              'the answer is "choice" (the most probable option), "confidence" and "distribution"',
    "score": 'a position on an ordered rubric: criteria {level: description, ...} from lowest to highest '
             '(2..26 levels); the answer is "score" (expected position, 0 = lowest .. 1 = highest), '
             '"level" (the most probable level), "confidence" and "distribution"',
}


@dataclass
class ToolCall:
    """One tool call the model asked for.

    Attributes:
        id: the call's id (send the tool's result back with ``tool_call_id=id``).
        name: the tool's name.
        arguments: the arguments as a dict (``{}`` when the model sent none), or None when the
            model's argument text is not a JSON object (``raw_arguments`` keeps it).
        raw_arguments: the argument text exactly as the model wrote it.
    """

    id: str
    name: str
    arguments: Optional[Dict[str, Any]]
    raw_arguments: str = ""


@dataclass
class ChatResult:
    """What ``chat()`` returns.

    Attributes:
        content: the reply text (no ``choices[0]`` wrapper), or None when the model called tools.
        tool_calls: the tool calls (set when ``finish_reason == "tool_calls"``), else None.
        finish_reason: ``stop``, ``length``, ``tool_calls``, ... as the endpoint reports it.
        usage: ``{"prompt_tokens", "completion_tokens", "total_tokens"}`` as reported.
        cost_usd: the provider's reported cost, else computed from ``prices``; None when neither
            is known (a local server with no prices set).
        model: the model name the endpoint answered with.
        raw: the endpoint's JSON body.
    """

    content: Optional[str]
    tool_calls: Optional[List[ToolCall]]
    finish_reason: Optional[str]
    usage: Dict[str, Any] = field(default_factory=dict)
    cost_usd: Optional[float] = None
    model: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def message(self) -> Dict[str, Any]:
        """This reply as an assistant message to append to ``messages`` for the next turn
        (before the ``{"role": "tool", "tool_call_id": ..., "content": ...}`` results)."""
        # "" rather than null beside tool calls: OpenAI takes either, some servers (llama.cpp's) only a string
        msg: Dict[str, Any] = {"role": "assistant", "content": self.content or ("" if self.tool_calls else None)}
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.raw_arguments}}
                                 for c in self.tool_calls]
        return msg


@dataclass
class DecideResult:
    """What ``decide()`` returns.

    Attributes:
        answers: ``{key: answer}`` under your question keys; each answer has ``"type"`` and the
            fields its type fixes (see ``QUESTION_TYPES``), plus ``"coverage"``: the probability
            mass the model put on the offered labels at all (low coverage: the question did not
            land; gate on it along with ``confidence``).
        cost_usd: input tokens only (scoring generates one token), from the provider or
            ``prices``; None when unknown.
        usage: summed ``prompt_tokens`` / ``completion_tokens`` over the questions.
        model: the model name the endpoint answered with.
    """

    answers: Dict[str, Dict[str, Any]]
    cost_usd: Optional[float] = None
    usage: Dict[str, int] = field(default_factory=dict)
    model: Optional[str] = None


# ----------------------------------------------------------------------------- the HTTP call

def _prices(prices: Optional[Tuple[float, float]]) -> Optional[Tuple[float, float]]:
    if prices is not None:
        return float(prices[0]), float(prices[1])
    text = os.environ.get(PRICES_ENV)
    if not text:
        return None
    try:
        a, b = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"${PRICES_ENV} must be 'IN,OUT' (USD per million tokens), not {text!r}") from None
    return a, b


def _endpoint(base_url: Optional[str]) -> str:
    url = base_url or os.environ.get(BASE_URL_ENV)
    if not url:
        raise ValueError(f"no endpoint: pass base_url= (e.g. http://127.0.0.1:8080/v1) or set ${BASE_URL_ENV}")
    return url.rstrip("/") + "/chat/completions"


def _provider_words(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300].strip() or resp.reason_phrase
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    if isinstance(err, str):
        return err
    if isinstance(body, dict) and body.get("detail"):
        return str(body["detail"])
    return json.dumps(body)[:300]


def _post(url: str, body: Dict[str, Any], api_key: Optional[str], timeout_s: float) -> Dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    key = api_key or os.environ.get(API_KEY_ENV)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        with httpx.Client(timeout=timeout_s) as http:
            resp = http.post(url, json=body, headers=headers)
    except httpx.TimeoutException as exc:
        raise Unavailable(f"the model endpoint {url} did not answer within {timeout_s:g} s ({type(exc).__name__})",
                          code="provider_timeout", hint="retry later, or raise timeout_s") from None
    except httpx.HTTPError as exc:
        raise Unavailable(f"cannot reach the model endpoint {url}: {exc}", code="provider_unreachable",
                          hint=f"is the server running? check base_url / ${BASE_URL_ENV}") from None
    rid = resp.headers.get("x-request-id")
    if resp.status_code == 429:
        ra = resp.headers.get("retry-after")
        try:
            retry_after = float(ra) if ra else None
        except ValueError:
            retry_after = None
        raise Unavailable(f"the provider is rate limiting: {_provider_words(resp)}", code="rate_limited",
                          retryable=True, retry_after_s=retry_after, request_id=rid, status_code=429,
                          hint="wait retry_after_s and retry")
    if resp.status_code >= 500:
        raise Unavailable(f"the provider failed ({resp.status_code}): {_provider_words(resp)}",
                          code="provider_error", request_id=rid, status_code=resp.status_code,
                          hint="the provider's side failed; retrying is a guess")
    if resp.status_code >= 400:
        unauthorized = resp.status_code in (401, 403)
        raise InvalidRequest(f"the provider refused the request ({resp.status_code}): {_provider_words(resp)}",
                             code="provider_unauthorized" if unauthorized else "provider_rejected",
                             request_id=rid, status_code=resp.status_code,
                             hint=(f"check the key (api_key= or ${API_KEY_ENV})" if unauthorized
                                   else "fix the request: model name, messages, parameters"))
    try:
        data = resp.json()
        data["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        raise Unavailable(f"the endpoint {url} answered {resp.status_code} without a chat completion: "
                          f"{resp.text[:200]!r}", code="provider_error", request_id=rid,
                          hint="is base_url an OpenAI-compatible /v1 root?") from None
    return data


def _cost(usage: Mapping[str, Any], prices: Optional[Tuple[float, float]], *, input_only: bool = False) -> Optional[float]:
    if isinstance(usage.get("cost"), (int, float)):
        return float(usage["cost"])
    if prices is None:
        return None
    out = 0.0 if input_only else prices[1] * float(usage.get("completion_tokens") or 0)
    return (prices[0] * float(usage.get("prompt_tokens") or 0) + out) / 1e6


def _tool_spec(tool: Any) -> Dict[str, Any]:
    """An OpenAI tool dict from an OpenAI tool dict, or from an MCP tool (``.name``,
    ``.description``, ``.input_schema`` / ``.inputSchema``, as ``mcp.Client.list_tools()`` gives)."""
    if isinstance(tool, Mapping):
        return dict(tool)
    schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {"type": "object"}
    return {"type": "function", "function": {"name": tool.name, "description": getattr(tool, "description", "") or "",
                                             "parameters": schema}}


def chat(model: str, messages: Sequence[Mapping[str, Any]], *, tools: Optional[Sequence[Any]] = None,
         tool_choice: Optional[Union[str, Mapping[str, Any]]] = None, max_tokens: Optional[int] = None,
         temperature: Optional[float] = None, base_url: Optional[str] = None, api_key: Optional[str] = None,
         prices: Optional[Tuple[float, float]] = None, timeout_s: float = 120.0, **params: Any) -> ChatResult:
    """One chat completion: messages in, a reply or tool calls out.

    Args:
        model: the endpoint's model name.
        messages: OpenAI-shaped messages (``{"role": "user", "content": ...}``; content may be a
            list of text / ``image_url`` parts for a vision model).
        tools: tools the model may call: OpenAI tool dicts, or MCP tools as listed by
            ``mcp.Client.list_tools()`` (converted: name, description, input schema).
        tool_choice: ``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "function":
            {"name": ...}}``; the endpoint's default when None.
        max_tokens, temperature: as the endpoint takes them; omitted when None.
        base_url, api_key, prices: see the module docstring (defaults from the environment).
        timeout_s: HTTP timeout (s, default 120).
        **params: other model parameters under their usual names (seed, stop, top_p, reasoning,
            ...), passed through unchanged.

    Returns a :class:`ChatResult` (``.content`` or ``.tool_calls``, ``.cost_usd``).

    Raises:
        InvalidRequest: the provider refused the request (in its words).
        Unavailable: a provider error, a rate limit, or the endpoint is down / timed out.
        ValueError: no base URL configured.
    """
    body: Dict[str, Any] = {"model": model, "messages": [dict(m) for m in messages], **params}
    if tools:
        body["tools"] = [_tool_spec(t) for t in tools]
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    if max_tokens is not None:
        body["max_tokens"] = int(max_tokens)
    if temperature is not None:
        body["temperature"] = float(temperature)
    data = _post(_endpoint(base_url), body, api_key, timeout_s)
    choice = data["choices"][0]
    msg = choice.get("message") or {}
    calls = None
    if msg.get("tool_calls"):
        calls = []
        for i, c in enumerate(msg["tool_calls"]):
            fn = c.get("function") or {}
            raw = fn.get("arguments")
            raw_text = raw if isinstance(raw, str) else json.dumps(raw or {})
            try:
                args = json.loads(raw_text) if raw_text.strip() else {}
            except ValueError:
                args = None
            calls.append(ToolCall(id=str(c.get("id") or f"call_{i}"), name=str(fn.get("name") or ""),
                                  arguments=args if isinstance(args, dict) else None, raw_arguments=raw_text))
    usage = dict(data.get("usage") or {})
    return ChatResult(content=msg.get("content"), tool_calls=calls, finish_reason=choice.get("finish_reason"),
                      usage=usage, cost_usd=_cost(usage, _prices(prices)), model=data.get("model"), raw=data)


# ----------------------------------------------------------------------------- decide

def _options(key: str, question: Mapping[str, Any]) -> Tuple[str, List[Tuple[str, str]]]:
    qtype = question.get("type")
    if qtype not in QUESTION_TYPES:
        raise ValueError(f"question {key!r}: type {qtype!r} is not one of {sorted(QUESTION_TYPES)}")
    criteria = question.get("criteria")
    if qtype == "noul":
        criteria = criteria or {"true": "yes", "false": "no"}
        if not isinstance(criteria, Mapping) or set(criteria) != {"true", "false"}:
            raise ValueError(f'question {key!r} (noul): criteria must be {{"true": ..., "false": ...}}')
        return qtype, [("true", str(criteria["true"])), ("false", str(criteria["false"]))]
    if isinstance(criteria, Mapping):
        items = [(str(k), str(v)) for k, v in criteria.items()]
    elif isinstance(criteria, Sequence) and not isinstance(criteria, str):
        items = [(str(v), str(v)) for v in criteria]
    else:
        raise ValueError(f"question {key!r} ({qtype}): criteria must be {{option: description}} or a list")
    if not 2 <= len(items) <= 26:
        raise ValueError(f"question {key!r} ({qtype}): needs 2..26 options, got {len(items)}")
    return qtype, items


def _prompt(state: Any, question: Mapping[str, Any], items: List[Tuple[str, str]], qtype: str) -> List[Dict[str, str]]:
    state_text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, default=str)
    letters = string.ascii_uppercase
    lines = [f"{letters[i]}. {name}: {desc}" for i, (name, desc) in enumerate(items)]
    kind = {"noul": "Is it true?", "choice": "Which option fits best?",
            "score": "Which level of this rubric (lowest first) fits?"}[qtype]
    return [
        {"role": "system", "content": "You judge a state against a question. Reply with one capital letter "
                                      "and nothing else."},
        {"role": "user", "content": f"State:\n{state_text}\n\nQuestion: {question.get('instructions') or ''}\n"
                                    f"{kind}\n" + "\n".join(lines) + "\n\nAnswer with the letter only."},
    ]


def _label_probs(data: Dict[str, Any], n: int) -> Tuple[List[float], float]:
    """Probabilities of the labels A.. (n of them) at the first generated token, renormalised
    over the labels, and the mass they had before that. Raises Unavailable when the endpoint
    sent no top log-probabilities."""
    choice = data["choices"][0]
    content = ((choice.get("logprobs") or {}).get("content")) or []
    if not content or not content[0].get("top_logprobs"):
        raise Unavailable("the endpoint returned no top_logprobs for decide()'s scoring token",
                          code="provider_error", hint="decide() needs an endpoint that returns logprobs "
                                                      "with top_logprobs (llama.cpp, vLLM and OpenAI do)")
    mass = [0.0] * n
    seen = set()
    for alt in content[0]["top_logprobs"]:
        tok = str(alt.get("token", "")).strip().rstrip(".):").upper()
        if len(tok) == 1 and "A" <= tok < chr(ord("A") + n):
            key = (tok, alt.get("token"))
            if key in seen:
                continue
            seen.add(key)
            mass[ord(tok) - ord("A")] += math.exp(float(alt.get("logprob", -math.inf)))
    total = sum(mass)
    if total <= 0.0:
        return [1.0 / n] * n, 0.0
    return [m / total for m in mass], min(1.0, total)


def decide(model: str, state: Any, questions: Mapping[str, Mapping[str, Any]], *, base_url: Optional[str] = None,
           api_key: Optional[str] = None, prices: Optional[Tuple[float, float]] = None, top_logprobs: int = 20,
           timeout_s: float = 120.0) -> DecideResult:
    """Score typed questions about ``state``; answers are probabilities, not parsed text.

    Each question is one completion of one token: the options are labelled A, B, C, ... and the
    answer is read from the log-probabilities of those labels at that token (``logprobs`` with
    ``top_logprobs``), renormalised over the labels. No max_tokens or temperature to set.

    Question types (``QUESTION_TYPES``)::

        {"type": "noul",   "instructions": "...", "criteria": {"true": "...", "false": "..."}}
            -> {"type": "noul", "noul": P(true), "confidence": max(P, 1-P), "coverage"}
        {"type": "choice", "instructions": "...", "criteria": {"billing": "...", "technical": "..."}}
            -> {"type": "choice", "choice": "billing", "confidence": 0.81, "distribution": {...}, "coverage"}
        {"type": "score",  "instructions": "...", "criteria": {"poor": "...", "ok": "...", "good": "..."}}
            -> {"type": "score", "score": 0..1 (expected position), "level": "ok", "confidence",
                "distribution": {...}, "coverage"}

    Args:
        model: the endpoint's model name.
        state: a string, object or array (objects and arrays are sent as JSON).
        questions: ``{key: question}``; each answer comes back under the same key.
        base_url, api_key, prices: see the module docstring. ``cost_usd`` counts input tokens only.
        top_logprobs: alternatives asked for at the scoring token (default 20, the OpenAI maximum).
        timeout_s: HTTP timeout per question (s, default 120).

    Raises:
        InvalidRequest: the provider refused a request (e.g. an unknown model).
        Unavailable: a provider error, a rate limit, the endpoint is down, or it sent no
            log-probabilities.
        ValueError: a question of an unknown type or with malformed criteria (before any request).
    """
    url = _endpoint(base_url)
    parsed = {key: _options(key, q) for key, q in questions.items()}
    answers: Dict[str, Dict[str, Any]] = {}
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    reported_cost: Optional[float] = 0.0
    answered_model = None
    for key, (qtype, items) in parsed.items():
        body = {"model": model, "messages": _prompt(state, questions[key], items, qtype), "max_tokens": 1,
                "temperature": 0.0, "logprobs": True, "top_logprobs": int(top_logprobs)}
        data = _post(url, body, api_key, timeout_s)
        answered_model = data.get("model", answered_model)
        u = data.get("usage") or {}
        usage["prompt_tokens"] += int(u.get("prompt_tokens") or 0)
        usage["completion_tokens"] += int(u.get("completion_tokens") or 0)
        if reported_cost is not None and isinstance(u.get("cost"), (int, float)):
            reported_cost += float(u["cost"])
        else:
            reported_cost = None
        probs, coverage = _label_probs(data, len(items))
        dist = {name: p for (name, _), p in zip(items, probs)}
        best = max(range(len(items)), key=lambda i: probs[i])
        if qtype == "noul":
            p = dist["true"]
            answers[key] = {"type": "noul", "noul": p, "confidence": max(p, 1.0 - p), "coverage": coverage}
        elif qtype == "choice":
            answers[key] = {"type": "choice", "choice": items[best][0], "confidence": probs[best],
                            "distribution": dist, "coverage": coverage}
        else:
            expected = sum(i * p for i, p in enumerate(probs)) / (len(items) - 1)
            answers[key] = {"type": "score", "score": expected, "level": items[best][0],
                            "confidence": probs[best], "distribution": dist, "coverage": coverage}
    cost = reported_cost if reported_cost is not None and answers and reported_cost > 0 else \
        _cost(usage, _prices(prices), input_only=True)
    return DecideResult(answers=answers, cost_usd=cost, usage=usage, model=answered_model)
