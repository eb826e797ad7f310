"""Adapters that record a framework's tool calls through a :class:`tally.Agent`
(sdk/python/README.md "Adapters"). Each module imports its framework only
when it is imported itself: ``import tally`` needs none of them.

- :mod:`tally.adapters.openai_agents`: the OpenAI Agents SDK's ``FunctionTool``
- :mod:`tally.adapters.langchain`: LangChain ``BaseTool`` / ``@tool`` (LangGraph too)
- :mod:`tally.adapters.openai`: the tool calls of an OpenAI Chat Completions or Responses response
- :mod:`tally.adapters.anthropic`: the ``tool_use`` blocks of an Anthropic message
- :mod:`tally.adapters.mcp`: an MCP Python SDK ``ClientSession``'s ``call_tool`` and ``list_tools``
"""
