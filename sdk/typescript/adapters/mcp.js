'use strict';
// The MCP TypeScript SDK adapter (README.md "Adapters"): records an MCP
// `Client`'s `callTool` from the client side, as `tally gateway` records a
// `tools/call` (docs/protocol.md §5), and declares what `listTools` returns
// as the program's recorded tools (§5.3). The Client is the
// `@modelcontextprotocol/sdk` package's; its methods are wrapped in place.

/**
 * Records `client`'s `callTool` (a decision before the request, then `ok`,
 * or `error` for a result with `isError` or a request that throws, which
 * is rethrown unchanged) and declares the tools each `listTools` returns,
 * with their full definitions, under the agent's source. Returns `client`.
 */
function recordClient(agent, client, { strict } = {}) {
  const callTool = client.callTool.bind(client);
  const listTools = client.listTools.bind(client);
  client.callTool = async (params, ...rest) => {
    const handle = await agent.call(params.name, params.arguments ?? {}, { strict });
    let result;
    try {
      result = await callTool(params, ...rest);
    } catch (err) {
      handle.error(err);
      throw err;
    }
    if (result && result.isError) handle.status('error', result);
    else handle.outcome(result);
    return result;
  };
  client.listTools = async (...args) => {
    const result = await listTools(...args);
    for (const tool of result.tools) agent._recorded(tool);
    await agent.declareTools();
    return result;
  };
  return client;
}

module.exports = { recordClient };
