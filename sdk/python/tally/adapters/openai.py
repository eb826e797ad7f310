"""The OpenAI client's tool-calling loop (``openai``): run the tool calls
of a response through recorded tools and get the messages to send back.

    from tally.adapters.openai import tool_messages

    completion = client.chat.completions.create(model=..., messages=messages, tools=specs)
    messages.append(completion.choices[0].message)
    messages += tool_messages(agent, completion, [lookup, refund])

Chat Completions (a ``ChatCompletion``: ``{"role": "tool", ...}`` messages)
and the Responses API (a ``Response``: ``function_call_output`` items) both
work. Each call is recorded with the model's tool-call id as the call id;
a tool that raises is recorded as ``error`` and its error text is sent back.

Call it on every response, the final one (no tool calls) too: the
response's text is checked against the agent's action tools
(``agent.action``, ``@agent.tool(action=True)``), and a turn that claims
one was done with no call to it is recorded as a claim (docs/protocol.md
§5.6).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import tally
from tally.adapters._loop import arun_call, run_call, tool_table

__all__ = ["atool_messages", "tool_messages"]

Tools = Mapping[str, Callable[..., Any]] | Iterable[Callable[..., Any]]


def _calls(response: Any) -> list[tuple[str, str, str, bool]]:
    """(call id, name, arguments JSON, is the Responses API) for each call."""
    out = []
    for choice in getattr(response, "choices", None) or []:
        for tc in choice.message.tool_calls or []:
            if getattr(tc, "type", "function") == "function":
                out.append((tc.id, tc.function.name, tc.function.arguments, False))
    for item in getattr(response, "output", None) or []:
        if getattr(item, "type", None) == "function_call":
            out.append((item.call_id, item.name, item.arguments, True))
    return out


def _text(response: Any) -> str:
    """The text the model wrote in ``response``: message content (Chat
    Completions) or ``output_text`` parts (Responses)."""
    parts = []
    for choice in getattr(response, "choices", None) or []:
        content = getattr(choice.message, "content", None)
        if isinstance(content, str):
            parts.append(content)
    for item in getattr(response, "output", None) or []:
        if getattr(item, "type", None) == "message":
            parts += [c.text for c in item.content if getattr(c, "type", None) == "output_text"]
    return "\n".join(parts)


def _message(call_id: str, content: str, responses_api: bool) -> dict[str, Any]:
    if responses_api:
        return {"type": "function_call_output", "call_id": call_id, "output": content}
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def tool_messages(agent: tally.Agent, response: Any, tools: Tools) -> list[dict[str, Any]]:
    """Runs each tool call of ``response`` through a recorded tool, in
    order; returns the tool messages (or ``function_call_output`` items)."""
    table = tool_table(tools)
    out = []
    calls = _calls(response)
    for call_id, name, arguments, responses_api in calls:
        content, _ = run_call(agent, table, name, arguments, call_id)
        out.append(_message(call_id, content, responses_api))
    agent.check_turn(_text(response), [c[1] for c in calls], final=not calls)
    return out


async def atool_messages(agent: tally.Agent, response: Any, tools: Tools) -> list[dict[str, Any]]:
    """:func:`tool_messages` for async tools (with ``openai.AsyncOpenAI``)."""
    table = tool_table(tools)
    out = []
    calls = _calls(response)
    for call_id, name, arguments, responses_api in calls:
        content, _ = await arun_call(agent, table, name, arguments, call_id)
        out.append(_message(call_id, content, responses_api))
    agent.check_turn(_text(response), [c[1] for c in calls], final=not calls)
    return out
