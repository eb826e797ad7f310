"""The OpenAI Agents SDK (``openai-agents``): its function tools, recorded.

    from agents import Agent as OpenAIAgent, function_tool
    from tally.adapters.openai_agents import record_tools

    tools = record_tools(agent, [get_weather])   # FunctionTools
    bot = OpenAIAgent(name="claims", tools=tools)

Each ``FunctionTool``'s ``on_invoke_tool`` is wrapped: a decision (with the
model's tool-call id as the call id) before it runs, an outcome after.
The tools are declared as the program's tool list, recorded.

``ClaimHooks(agent)``, passed as ``Runner.run(..., hooks=...)``, checks each
model response's text against the agent's action tools (``agent.action``)
and records a claim for one it says was done with no call to it
(docs/protocol.md §5.6).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from agents import FunctionTool, ModelResponse, RunHooks
from agents.tool_context import ToolContext

import tally

__all__ = ["ClaimHooks", "record_tool", "record_tools"]


def record_tool(agent: tally.Agent, tool: FunctionTool) -> FunctionTool:
    """A copy of ``tool`` whose calls are recorded by ``agent``."""
    invoke = tool.on_invoke_tool

    async def recorded(ctx: ToolContext[Any], input_json: str) -> Any:
        try:
            arguments = json.loads(input_json) if input_json else {}
        except json.JSONDecodeError:
            arguments = {"raw": input_json}
        call_id = getattr(ctx, "tool_call_id", None) or None
        async with agent.call(tool.name, arguments, call_id=call_id) as call:
            result = await invoke(ctx, input_json)
            call.outcome(result if isinstance(result, (str, int, float, bool, list, dict, type(None))) else str(result))
        return result

    return dataclasses.replace(tool, on_invoke_tool=recorded)


def record_tools(agent: tally.Agent, tools: Iterable[FunctionTool], *, declare: bool = True) -> list[FunctionTool]:
    """``record_tool`` for each; with ``declare``, the tools are also
    declared (recorded) as the program's full tool list."""
    out = [record_tool(agent, t) for t in tools]
    if declare:
        agent.declare_tools(
            [{"name": t.name, "description": t.description, "inputSchema": t.params_json_schema} for t in out],
            recorded=[t.name for t in out],
        )
    return out


class ClaimHooks(RunHooks[Any]):
    """Run hooks that check every model response of a run for claims of
    the agent's action tools (docs/protocol.md §5.6)."""

    def __init__(self, agent: tally.Agent) -> None:
        super().__init__()
        self.tally_agent = agent

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        text, called = [], []
        for item in response.output:
            kind = getattr(item, "type", None)
            if kind == "message":
                text += [c.text for c in item.content if getattr(c, "type", None) == "output_text"]
            elif kind == "function_call":
                called.append(item.name)
        self.tally_agent.check_turn("\n".join(text), called, final=not called)
