"""A minimal MCP client for the quickstart: it starts an MCP server behind
`tally gateway`, lists the tools and makes a few calls, so that the agent's
chain gets a tool list, decisions and outcomes.

    pip install mcp==2.3.0
    python3 examples/mcp_client.py --agent claims-bot -- npx -y @modelcontextprotocol/server-everything stdio

Everything after `--` is the MCP server command. The gateway records each
call before forwarding it and syncs to the witness configured with
`tally agent init --witness`.
"""

import argparse
import asyncio
import os
import shutil

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", required=True, help="the agent whose chain records the calls")
    parser.add_argument("--tally", default=shutil.which("tally") or "tally", help="path to the tally binary")
    parser.add_argument("--strict", action="store_true", help="pass --strict to the gateway (wait for receipts)")
    parser.add_argument("server", nargs=argparse.REMAINDER, help="-- then the MCP server command")
    args = parser.parse_args()
    server = args.server[1:] if args.server[:1] == ["--"] else args.server
    if not server:
        parser.error("give the MCP server command after --")

    gateway = [args.tally, "gateway", "--agent", args.agent, *(["--strict"] if args.strict else []), "--", *server]
    params = StdioServerParameters(command=gateway[0], args=gateway[1:], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            print(f"{len(tools.tools)} tools: {', '.join(t.name for t in tools.tools)}")
            for name, arguments in [("echo", {"message": "hello through tally"}), ("get-sum", {"a": 2, "b": 3})]:
                if any(t.name == name for t in tools.tools):
                    result = await session.call_tool(name, arguments)
                    text = " ".join(c.text for c in result.content if getattr(c, "text", None))
                    print(f"{name}({arguments}) -> {'error: ' if result.is_error else ''}{text}")


if __name__ == "__main__":
    asyncio.run(main())
