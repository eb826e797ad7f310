"""A small MCP server of the action tests' own (test_actions.py), on the
official MCP Python SDK over stdio: `send_email` returns the message id the
"mail system" gave back as structured content, none for an address it only
queued, and fails for one it refuses."""

from pydantic import BaseModel

from mcp.server.mcpserver import MCPServer

server = MCPServer("mail")


class Sent(BaseModel):
    message_id: str | None = None
    queued: bool = False


@server.tool()
def send_email(to: str, body: str = "") -> Sent:
    """Sends an email."""
    if to == "bounce@example.com":
        raise ValueError("the mail system refused the address")
    if to.endswith("@later.example.com"):
        return Sent(queued=True)
    return Sent(message_id=f"<{len(body)}.{to}@mail.example.com>")


@server.tool()
def lookup(to: str) -> str:
    """Looks a contact up."""
    return f"{to} is a customer"


if __name__ == "__main__":
    server.run()
