"""LangChain tools (``langchain-core``'s ``BaseTool``, ``@tool``), recorded;
LangGraph's prebuilt agents and ``ToolNode`` take the same tools.

    from langchain_core.tools import tool
    from tally.adapters.langchain import record_tools

    @tool
    def lookup(claim: int) -> str:
        "Looks a claim up."
        ...

    [lookup] = record_tools(agent, [lookup])

Each tool becomes a ``StructuredTool`` of the same name, description and
argument schema whose runs go through ``agent.call``: a decision with the
validated arguments (the tool call's id as call id, when invoked with a
tool call) before the original tool runs, an outcome after; an exception
records ``error`` and propagates as LangChain would raise it.

``ClaimCallback(agent)``, a callback handler given to the chat model (or the
run's ``config={"callbacks": [...]}``), checks each model turn's text
against the agent's action tools (``agent.action``) and records a claim for
one it says was done with no call to it (docs/protocol.md §5.6).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import LLMResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool

import tally

__all__ = ["ClaimCallback", "record_tool", "record_tools"]


def _result(value: Any) -> Any:
    content = getattr(value, "content", value)
    return content if isinstance(content, (str, int, float, bool, list, dict, type(None))) else str(content)


def record_tool(agent: tally.Agent, tool: BaseTool) -> BaseTool:
    """A tool like ``tool`` whose calls are recorded by ``agent``."""

    def run(config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        call_id = (config or {}).get("metadata", {}).get("tool_call_id")
        with agent.call(tool.name, kwargs, call_id=call_id) as call:
            result = tool.invoke(kwargs, config=config)
            call.outcome(_result(result))
        return result

    async def arun(config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        call_id = (config or {}).get("metadata", {}).get("tool_call_id")
        async with agent.call(tool.name, kwargs, call_id=call_id) as call:
            result = await tool.ainvoke(kwargs, config=config)
            call.outcome(_result(result))
        return result

    return StructuredTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        func=run,
        coroutine=arun,
        return_direct=tool.return_direct,
        handle_tool_error=tool.handle_tool_error,
        handle_validation_error=tool.handle_validation_error,
    )


def record_tools(agent: tally.Agent, tools: Iterable[BaseTool], *, declare: bool = True) -> list[BaseTool]:
    """``record_tool`` for each; with ``declare``, the tools are also
    declared (recorded) as the program's full tool list."""
    out = [record_tool(agent, t) for t in tools]
    if declare:
        agent.declare_tools(
            [{"name": t.name, "description": t.description, "inputSchema": t.get_input_jsonschema()} for t in out],
            recorded=[t.name for t in out],
        )
    return out


def _turn_text(message: Any) -> str:
    content = getattr(message, "content", "")
    if isinstance(content, str):
        return content
    return "\n".join(
        b if isinstance(b, str) else str(b.get("text", ""))
        for b in content
        if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")
    )


class ClaimCallback(BaseCallbackHandler):
    """Checks every chat model turn for claims of the agent's action tools
    (docs/protocol.md §5.6)."""

    def __init__(self, agent: tally.Agent) -> None:
        self.tally_agent = agent

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        for generations in response.generations:
            for g in generations[:1]:
                message = getattr(g, "message", None)
                if message is None:
                    continue
                called = [tc["name"] for tc in getattr(message, "tool_calls", None) or []]
                self.tally_agent.check_turn(_turn_text(message), called, final=not called)
