"""A planner loop: a vision-language model drives the simulated cell through MCP tools.

    python examples/vlm_agent/agent.py --mcp http://127.0.0.1:8471/mcp --model MODEL \\
        [--base-url http://127.0.0.1:8080/v1] [--instruction "..."] [--max-turns 12]

Each turn: ``snapshot`` (the exterior camera, as an image) -> ``sequence_ai.chat()`` with the
MCP server's tools -> every tool call the model makes is printed and made on the MCP server
(``act`` drives the robot; the server bounds it by its ``max_seconds`` cap) -> its result goes
back to the model as a tool message. The loop ends when the model answers in text without a
tool call, or after ``--max-turns``.

The endpoint is any OpenAI-compatible one (``--base-url`` or ``$SEQUENCES_CHAT_BASE_URL``; key
in ``$SEQUENCES_CHAT_API_KEY``). Planning needs a real vision-language model that follows tool
schemas; with the tiny test model of test/_tiny_gguf.py the loop runs but the "plan" is what its
fixed weights produce (an empty instruction, which the server refuses with a typed error).

``--mcp`` takes the URL of ``sequence-ai mcp --http`` or, with ``--stdio``, the command line that
starts one (e.g. ``--stdio "sequence-ai mcp --model pick-place"``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any, Dict, List

import anyio

import sequence_ai

DEFAULT_INSTRUCTION = "put the red cube on the green pad, then the blue cube on the red pad"
SYSTEM = (
    "You control a robot arm over a table with coloured cubes and pads, through tools. "
    "act(instruction, max_seconds) runs a low-level policy for ONE pick-and-place step, phrased as "
    "'put the <colour> cube on the <colour> pad'; give it about 20 seconds. Split a longer task into "
    "such steps and call act once per step, in order, checking the camera image between steps. "
    "When the whole task is done, reply with a short sentence and no tool call.")


def _image_part(content: List[Any]) -> Dict[str, Any]:
    for block in content:
        if getattr(block, "type", None) == "image":
            return {"type": "image_url", "image_url": {"url": f"data:{block.mime_type};base64,{block.data}"}}
    raise RuntimeError("snapshot returned no image")


def _result_text(result: Any) -> str:
    if result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(getattr(b, "text", "") for b in result.content)


async def plan_and_drive(client: Any, *, model: str, instruction: str, base_url: str | None, max_turns: int,
                         tool_choice: Any = None, view: str = "exterior_1", send_image: bool = True,
                         temperature: float | None = None, say=print) -> List[Dict[str, Any]]:
    """Run the loop on a connected ``mcp.Client``; returns the tool calls made
    (``[{"name", "arguments", "is_error", "result"}]``). ``send_image=False`` still takes the
    snapshot each turn but sends the model only text (for a text-only model)."""
    tools = [t for t in (await client.list_tools()).tools if t.name in ("act", "interrupt", "status", "snapshot")]
    messages: List[Dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    made: List[Dict[str, Any]] = []
    for turn in range(1, max_turns + 1):
        snap = await client.call_tool("snapshot", {"view": view})
        messages.append({"role": "user", "content": [
            {"type": "text", "text": f"Task: {instruction}\nThe camera now ({view}):" if turn == 1
             else f"The camera now ({view}). Continue the task: {instruction}"},
            _image_part(snap.content) if send_image else {"type": "text", "text": "(image not sent)"}]})
        reply = await anyio.to_thread.run_sync(lambda: sequence_ai.chat(
            model, messages, tools=tools, tool_choice=tool_choice, base_url=base_url, max_tokens=512,
            temperature=temperature))
        messages.append(reply.message)
        if not reply.tool_calls:
            say(f"[turn {turn}] model: {reply.content!r} (no tool call: done)")
            break
        for call in reply.tool_calls:
            say(f"[turn {turn}] tool call: {call.name}({call.raw_arguments})")
            if call.arguments is None:
                text, is_error = f"arguments are not a JSON object: {call.raw_arguments!r}", True
            else:
                result = await client.call_tool(call.name, call.arguments)
                text, is_error = _result_text(result), bool(result.is_error)
            say(f"[turn {turn}]   -> {'error: ' if is_error else ''}{text[:300]}")
            made.append({"name": call.name, "arguments": call.arguments, "is_error": is_error, "result": text})
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    return made


async def _main(args: argparse.Namespace) -> int:
    from mcp import Client, StdioServerParameters

    if args.stdio:
        argv = shlex.split(args.mcp)
        # the SDK starts the server with a minimal environment: pass ours (SEQUENCES_API_KEY, ...)
        target: Any = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))
    else:
        target = args.mcp
    tool_choice = None if args.tool_choice == "auto" else (
        {"type": "function", "function": {"name": args.tool_choice}}
        if args.tool_choice not in ("none", "required") else args.tool_choice)
    async with Client(target) as client:
        try:
            made = await plan_and_drive(client, model=args.model, instruction=args.instruction,
                                        base_url=args.base_url, max_turns=args.max_turns, tool_choice=tool_choice,
                                        send_image=not args.no_image, temperature=args.temperature)
        except sequence_ai.SequencesError as exc:
            print(f"error[{exc.code}]: {exc}", file=sys.stderr)
            return 1
    print(f"{len(made)} tool calls, {sum(1 for m in made if m['is_error'])} refused")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mcp", default="http://127.0.0.1:8471/mcp", help="MCP server URL (or command with --stdio)")
    p.add_argument("--stdio", action="store_true", help="--mcp is a command line to start over stdio")
    p.add_argument("--model", required=True, help="the endpoint's model name (a vision-language model)")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible /v1 root (default $SEQUENCES_CHAT_BASE_URL)")
    p.add_argument("--instruction", default=DEFAULT_INSTRUCTION)
    p.add_argument("--max-turns", type=int, default=12)
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the endpoint's)")
    p.add_argument("--no-image", action="store_true", help="send the model text only (a text-only model)")
    p.add_argument("--tool-choice", default="auto", help="auto | none | required | a tool name to force")
    return anyio.run(_main, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
