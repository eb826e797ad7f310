"""A minimal MCP client for the quickstart: it starts an MCP server behind
`tally gateway`, lists the tools and makes a few calls, so that the agent's
chain gets a tool list, decisions and outcomes.

The official MCP Python SDK needs Python 3.10 or newer; install it in a
virtual environment (many systems refuse `pip install` outside one):

    python3 -m venv .venv && . .venv/bin/activate
    pip install mcp==2.3.0
    python3 examples/mcp_client.py --agent claims-bot -- npx -y @modelcontextprotocol/server-everything stdio

Everything after `--` is the MCP server command. The gateway records each
call before forwarding it and syncs to the witness configured with
`tally agent init --witness`. On failure it prints one line with the cause
(the gateway's own message, if any, is just above it); --debug prints the
whole traceback instead.

With --url the client speaks MCP's Streamable HTTP transport to a gateway
already running in front of a remote server (`tally gateway --agent NAME
--upstream URL`), and --header adds the client's own headers (credentials
pass through the gateway to the server and are never recorded):

    python3 examples/mcp_client.py --url http://127.0.0.1:7879/mcp --header "Authorization: Bearer $TOKEN"
"""

import argparse
import asyncio
import os
import shutil
import sys

MIN_PYTHON = (3, 10)

try:
    _GROUP = BaseExceptionGroup  # Python 3.11 and newer
except NameError:  # 3.10: the backport anyio depends on
    try:
        from exceptiongroup import BaseExceptionGroup as _GROUP
    except ImportError:
        _GROUP = ()


def fail(message: str) -> None:
    print(f"mcp_client: error: {message}", file=sys.stderr)
    sys.exit(1)


def root_causes(e: BaseException) -> list[BaseException]:
    """The leaves of an exception group (anyio wraps failures in them), else the exception itself."""
    if isinstance(e, _GROUP):
        return [leaf for inner in e.exceptions for leaf in root_causes(inner)]
    return [e]


def describe(e: BaseException, tally: str) -> str:
    """One line that says what went wrong and what to do."""
    if isinstance(e, FileNotFoundError) and e.filename in (tally, os.path.basename(tally)):
        return f"{tally} not found: build tally and put it on PATH, or give --tally PATH"
    if isinstance(e, FileNotFoundError):
        return f"{e.filename or e}: not found"
    text = str(e) or type(e).__name__
    if "Connection closed" in text:
        return "the MCP session ended early: the gateway or the server behind it exited (its message, if any, is above)"
    return f"{type(e).__name__}: {text}"


async def calls(session) -> None:
    await session.initialize()
    tools = await session.list_tools()
    print(f"{len(tools.tools)} tools: {', '.join(t.name for t in tools.tools)}")
    for name, arguments in [("echo", {"message": "hello through tally"}), ("get-sum", {"a": 2, "b": 3})]:
        if any(t.name == name for t in tools.tools):
            result = await session.call_tool(name, arguments)
            text = " ".join(c.text for c in result.content if getattr(c, "text", None))
            print(f"{name}({arguments}) -> {'error: ' if result.is_error else ''}{text}")


async def run(args: argparse.Namespace, server: list[str]) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    if args.url:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = dict(h.split(":", 1) for h in args.header)
        headers = {k.strip(): v.strip() for k, v in headers.items()}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with streamable_http_client(args.url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await calls(session)
        return
    gateway = [args.tally, "gateway", "--agent", args.agent, *(["--strict"] if args.strict else []), "--", *server]
    params = StdioServerParameters(command=gateway[0], args=gateway[1:], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await calls(session)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", help="the agent whose chain records the calls (stdio)")
    parser.add_argument("--url", help="a tally gateway's Streamable HTTP endpoint, instead of starting one over stdio")
    parser.add_argument("--header", action="append", default=[], help='"Name: value" sent with every request (with --url)')
    parser.add_argument("--tally", default=shutil.which("tally") or "tally", help="path to the tally binary")
    parser.add_argument("--strict", action="store_true", help="pass --strict to the gateway (wait for receipts)")
    parser.add_argument("--debug", action="store_true", help="print the whole traceback on failure")
    parser.add_argument("server", nargs=argparse.REMAINDER, help="-- then the MCP server command")
    args = parser.parse_args()
    server = args.server[1:] if args.server[:1] == ["--"] else args.server
    if not args.url and (not args.agent or not server):
        parser.error("give --agent and the MCP server command after -- (or --url)")
    if sys.version_info < MIN_PYTHON:
        fail(f"the MCP Python SDK needs Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer; this is {sys.version.split()[0]}")
    try:
        import mcp  # noqa: F401
    except ImportError:
        fail("the MCP Python SDK is not installed here: python3 -m venv .venv && . .venv/bin/activate && pip install mcp==2.3.0")
    try:
        asyncio.run(run(args, server))
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException as e:  # noqa: BLE001 -- one line instead of a traceback
        if args.debug or isinstance(e, SystemExit):
            raise
        fail(describe(root_causes(e)[0], args.tally))


if __name__ == "__main__":
    main()
