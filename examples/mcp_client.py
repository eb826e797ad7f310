"""A minimal MCP client for the quickstart: it starts an MCP server behind
`tally gateway`, lists the tools and makes a few calls, so that the agent's
chain gets a tool list, decisions and outcomes.

    pip install mcp==2.3.0
    python3 examples/mcp_client.py --agent claims-bot -- npx -y @modelcontextprotocol/server-everything stdio

Everything after `--` is the MCP server command. The gateway records each
call before forwarding it and syncs to the witness configured with
`tally agent init --witness`.

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

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client


async def calls(session: ClientSession) -> None:
    await session.initialize()
    tools = await session.list_tools()
    print(f"{len(tools.tools)} tools: {', '.join(t.name for t in tools.tools)}")
    for name, arguments in [("echo", {"message": "hello through tally"}), ("get-sum", {"a": 2, "b": 3})]:
        if any(t.name == name for t in tools.tools):
            result = await session.call_tool(name, arguments)
            text = " ".join(c.text for c in result.content if getattr(c, "text", None))
            print(f"{name}({arguments}) -> {'error: ' if result.is_error else ''}{text}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", help="the agent whose chain records the calls (stdio)")
    parser.add_argument("--url", help="a tally gateway's Streamable HTTP endpoint, instead of starting one over stdio")
    parser.add_argument("--header", action="append", default=[], help='"Name: value" sent with every request (with --url)')
    parser.add_argument("--tally", default=shutil.which("tally") or "tally", help="path to the tally binary")
    parser.add_argument("--strict", action="store_true", help="pass --strict to the gateway (wait for receipts)")
    parser.add_argument("server", nargs=argparse.REMAINDER, help="-- then the MCP server command")
    args = parser.parse_args()
    if args.url:
        headers = dict(h.split(":", 1) for h in args.header)
        headers = {k.strip(): v.strip() for k, v in headers.items()}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with streamable_http_client(args.url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await calls(session)
        return

    server = args.server[1:] if args.server[:1] == ["--"] else args.server
    if not args.agent or not server:
        parser.error("give --agent and the MCP server command after -- (or --url)")
    gateway = [args.tally, "gateway", "--agent", args.agent, *(["--strict"] if args.strict else []), "--", *server]
    params = StdioServerParameters(command=gateway[0], args=gateway[1:], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await calls(session)


if __name__ == "__main__":
    asyncio.run(main())
