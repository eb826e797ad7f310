"""The Anthropic client's tool-use loop (``anthropic``): run the
``tool_use`` blocks of a message through recorded tools and get the user
message of ``tool_result`` blocks to send back.

    from tally.adapters.anthropic import tool_results

    message = client.messages.create(model=..., messages=messages, tools=specs, max_tokens=1024)
    messages.append({"role": "assistant", "content": message.content})
    messages.append(tool_results(agent, message, [lookup, refund]))

Each call is recorded with the block's id as the call id; a tool that
raises is recorded as ``error`` and answered with ``is_error``.

Call it on every message, the final one (no ``tool_use``) too: the
message's text blocks are checked against the agent's action tools, and a
turn that claims one was done with no call to it is recorded as a claim
(docs/protocol.md §5.6).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import tally
from tally.adapters._loop import arun_call, run_call, tool_table

__all__ = ["atool_results", "tool_results"]

Tools = Mapping[str, Callable[..., Any]] | Iterable[Callable[..., Any]]


def _uses(message: Any) -> list[Any]:
    return [b for b in message.content if getattr(b, "type", None) == "tool_use"]


def _check(agent: tally.Agent, message: Any) -> None:
    text = "\n".join(b.text for b in message.content if getattr(b, "type", None) == "text")
    uses = _uses(message)
    agent.check_turn(text, [b.name for b in uses], final=not uses)


def _result(block_id: str, content: str, is_error: bool) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": block_id, "content": content, "is_error": is_error}


def tool_results(agent: tally.Agent, message: Any, tools: Tools) -> dict[str, Any]:
    """Runs each ``tool_use`` block of ``message``; returns the user message
    holding their ``tool_result`` blocks, in order."""
    table = tool_table(tools)
    blocks = [_result(b.id, *run_call(agent, table, b.name, b.input, b.id)) for b in _uses(message)]
    _check(agent, message)
    return {"role": "user", "content": blocks}


async def atool_results(agent: tally.Agent, message: Any, tools: Tools) -> dict[str, Any]:
    """:func:`tool_results` for async tools (with ``anthropic.AsyncAnthropic``)."""
    table = tool_table(tools)
    blocks = [_result(b.id, *(await arun_call(agent, table, b.name, b.input, b.id))) for b in _uses(message)]
    _check(agent, message)
    return {"role": "user", "content": blocks}
