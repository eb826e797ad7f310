"""The MCP Python SDK's ``ClientSession``, recorded from the client side:
for an MCP server that cannot be put behind ``tally gateway``.

    from tally.adapters.mcp import RecordedSession

    async with ClientSession(read, write) as session:
        session = RecordedSession(tally.Agent("claims-bot", source="mcp:crm"), session)
        await session.initialize()
        await session.list_tools()                 # declared, recorded
        await session.call_tool("lookup", {"claim": 7})

``call_tool``: a decision before the request, an outcome after (``error``
when the result has ``isError`` or the request raises). ``list_tools``:
the listed tools are declared as the agent's tool list under its source,
recorded. Everything else is the session's own. Give the agent a source of
its own (``source="mcp:<server>"``) when the program declares other tools.
"""

from __future__ import annotations

from typing import Any

from mcp import ClientSession, types

import tally

__all__ = ["RecordedSession"]


class RecordedSession:
    """``session`` with ``call_tool`` and ``list_tools`` recorded by ``agent``."""

    def __init__(self, agent: tally.Agent, session: ClientSession) -> None:
        self.agent = agent
        self.session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        async with self.agent.call(name, arguments or {}) as call:
            result = await self.session.call_tool(name, arguments, *args, **kwargs)
            dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            failed = getattr(result, "is_error", None) or getattr(result, "isError", False)
            call.outcome(dumped, "error" if failed else "ok")
        return result

    async def list_tools(self, *args: Any, **kwargs: Any) -> types.ListToolsResult:
        listed = await self.session.list_tools(*args, **kwargs)
        definitions = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools]
        self.agent.declare_tools(definitions, recorded=[d["name"] for d in definitions])
        return listed
