"""What the OpenAI and Anthropic loop helpers share: run one tool call of
a model's response through a recorded tool."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import tally


def tool_table(tools: Mapping[str, Callable[..., Any]] | Iterable[Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    if isinstance(tools, Mapping):
        return dict(tools)
    return {getattr(f, "__tally_tool__", None) or f.__name__: f for f in tools}


def text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


def run_call(
    agent: tally.Agent, tools: dict[str, Callable[..., Any]], name: str, arguments: Any, call_id: str
) -> tuple[str, bool]:
    """Runs the call; returns (content for the model, is_error). A function
    already wrapped with ``@agent.tool`` records itself; any other is
    recorded here, with the model's tool-call id as the call id. A tool
    that raises is recorded as ``error`` and its error goes back to the
    model, as a tool-calling loop does; a call that cannot be recorded
    (``tally.TallyError``) is raised: it did not run."""
    fn = tools.get(name)
    if fn is None:
        return f"error: unknown tool {name!r}", True
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError as e:
            return f"error: the arguments are not JSON: {e}", True
    if not isinstance(arguments, dict):
        return "error: the arguments are not a JSON object", True
    try:
        if getattr(fn, "__tally_tool__", None):
            result = fn(**arguments)
        else:
            with agent.call(name, arguments, call_id=call_id) as call:
                result = fn(**arguments)
                if inspect.isawaitable(result):
                    raise TypeError(f"tool {name!r} is async: use the async helper")
                call.outcome(result)
    except tally.TallyError:
        raise
    except Exception as e:  # the model sees the error, the chain records it
        return f"error: {type(e).__name__}: {e}", True
    return text(result), False


async def arun_call(
    agent: tally.Agent, tools: dict[str, Callable[..., Any]], name: str, arguments: Any, call_id: str
) -> tuple[str, bool]:
    """:func:`run_call` for async (or sync) tools, on the event loop."""
    fn = tools.get(name)
    if fn is None:
        return f"error: unknown tool {name!r}", True
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError as e:
            return f"error: the arguments are not JSON: {e}", True
    if not isinstance(arguments, dict):
        return "error: the arguments are not a JSON object", True
    try:
        if getattr(fn, "__tally_tool__", None):
            result = fn(**arguments)
            if inspect.isawaitable(result):
                result = await result
        else:
            async with agent.call(name, arguments, call_id=call_id) as call:
                result = fn(**arguments)
                if inspect.isawaitable(result):
                    result = await result
                call.outcome(result)
    except tally.TallyError:
        raise
    except Exception as e:
        return f"error: {type(e).__name__}: {e}", True
    return text(result), False
