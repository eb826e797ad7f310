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

With ``lock=`` and ``policy=`` (a baseline from ``tally tools approve`` and
a policy, docs/operations.md "Approved tool definitions") and the server's
``command=`` (its argv, as approved) or ``url=``, the session enforces what
``tally gateway --lock --policy`` enforces (docs/protocol.md §5.7), through
the same core: ``initialize``'s ``serverInfo`` is compared with the
approved one (another name denies the session, another version is
recorded), then it lists and checks the tools, every
``list_tools`` is checked and answered without the paused tools, and a call
to a paused tool (or any call of a paused or denied session) raises
``ToolCheckRefused`` (its ``reason``: ``tool_paused``,
``session_paused``, ``session_denied``) without running or being recorded.
The session's ``notifications/tools/list_changed`` is taken from the
``ClientSession``'s ``message_handler`` (the one given to it still gets
every message): the next call checks the tools again first (``tools_changed()``
does the same by hand). Each check is a ``tool_check`` record in the agent's
chain.
"""

from __future__ import annotations

import json
from typing import Any

from mcp import ClientSession, types

import tally

__all__ = ["RecordedSession", "ToolCheckRefused"]


class ToolCheckRefused(tally.TallyError):
    """A call the tool check refused: it did not run and was not recorded."""

    code = "tool_check_refused"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RecordedSession:
    """``session`` with ``call_tool`` and ``list_tools`` recorded by ``agent``
    (and checked against an approved baseline with ``lock`` and ``policy``)."""

    def __init__(
        self,
        agent: tally.Agent,
        session: ClientSession,
        *,
        lock: str | None = None,
        policy: str | None = None,
        command: list[str] | None = None,
        url: str | None = None,
    ) -> None:
        self.agent = agent
        self.session = session
        self._check = None
        if lock is not None or policy is not None:
            if lock is None or policy is None:
                raise ValueError("a tool check needs both lock= and policy=")
            self._check = agent._writer().tool_check(str(lock), str(policy), command=command, url=url)
            self._hook_list_changed()

    def _hook_list_changed(self) -> None:
        # ClientSession hands every server notification to its
        # message_handler, read at each one: wrapped here, passed on.
        handler = self.session._message_handler

        async def on_message(message: Any) -> None:
            if isinstance(getattr(message, "root", message), types.ToolListChangedNotification):
                self.tools_changed()
            await handler(message)

        self.session._message_handler = on_message

    async def initialize(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.session.initialize(*args, **kwargs)
        if self._check is not None:
            info = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            if self.agent._writer().server_info(self._check, json.dumps(info).encode()):
                # Denied: recorded; every call is refused, no list is read.
                return result
            await self._checked_list(initialize=True)
        return result

    def tools_changed(self) -> None:
        """The server sent notifications/tools/list_changed."""
        if self._check is not None:
            self.agent._writer().tools_changed(self._check)

    async def _checked_list(self, initialize: bool, *args: Any, **kwargs: Any) -> types.ListToolsResult | None:
        try:
            listed = await self.session.list_tools(*args, **kwargs)
        except Exception:
            self.agent._writer().check_tools(self._check, initialize, None)
            raise
        definitions = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools]
        hidden = set(self.agent._writer().check_tools(self._check, initialize, json.dumps(definitions).encode()))
        listed.tools = [t for t in listed.tools if t.name not in hidden]
        return listed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        if self._check is not None:
            refused = self.agent._writer().admit_tool(self._check, name)
            if refused is not None and refused[0] == "tool_check_pending":
                await self._checked_list(False)
                refused = self.agent._writer().admit_tool(self._check, name)
            if refused is not None:
                raise ToolCheckRefused(*refused)
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
        if self._check is not None:
            hidden = set(self.agent._writer().check_tools(self._check, False, json.dumps(definitions).encode()))
            listed.tools = [t for t in listed.tools if t.name not in hidden]
        return listed
