'use strict';
// The MCP TypeScript SDK adapter (README.md "Adapters"): records an MCP
// `Client`'s `callTool` from the client side, as `tally gateway` records a
// `tools/call` (docs/protocol.md §5), and declares what `listTools` returns
// as the program's recorded tools (§5.3). The Client is the
// `@modelcontextprotocol/sdk` package's; its methods are wrapped in place.
// With `lock` and `policy` it also enforces an approved tool baseline as
// `tally gateway --lock --policy` does (docs/protocol.md §5.7), through
// the same Rust core.

/** A call the tool check refused: it did not run and was not recorded. */
class ToolCheckRefused extends Error {
  constructor(reason, message) {
    super(message);
    this.name = 'ToolCheckRefused';
    this.code = 'tool_check_refused';
    this.reason = reason;
  }
}

const LIST_CHANGED = 'notifications/tools/list_changed';

/**
 * Takes the server's notifications/tools/list_changed on `client` (the
 * Protocol's setNotificationHandler with the SDK's
 * ToolListChangedNotificationSchema): `onChanged` runs first, then the
 * handler the program set before or sets after (or the Client's own
 * `listChanged` option), which still gets every notification.
 */
function hookListChanged(client, onChanged) {
  const { ToolListChangedNotificationSchema: schema } = require('@modelcontextprotocol/sdk/types.js');
  const set = client.setNotificationHandler.bind(client);
  const isListChanged = (s) => s === schema || s?.shape?.method?.value === LIST_CHANGED;
  const chained = (handler) => async (notification) => {
    onChanged();
    if (handler) await handler(notification);
  };
  client.setNotificationHandler = (s, handler) => set(s, isListChanged(s) ? chained(handler) : handler);
  set(schema, chained(client._notificationHandlers?.get(LIST_CHANGED)));
}

/**
 * Records `client`'s `callTool` (a decision before the request, then `ok`,
 * or `error` for a result with `isError` or a request that throws, which
 * is rethrown unchanged) and declares the tools each `listTools` returns,
 * with their full definitions, under the agent's source. Returns `client`.
 */
function recordClient(agent, client, { strict, lock, policy, command, url } = {}) {
  const callTool = client.callTool.bind(client);
  const listTools = client.listTools.bind(client);
  let check = null;
  if (lock != null || policy != null) {
    if (lock == null || policy == null) throw new TypeError('a tool check needs both lock and policy');
    check = agent._toolCheck(String(lock), String(policy), command, url);
    const connect = client.connect.bind(client);
    // After initialize (connect): serverInfo is compared with the approved
    // one; unless that denied the session, the tools are listed and checked.
    client.connect = async (...args) => {
      const done = await connect(...args);
      const denied = agent._serverInfo(check, { serverInfo: client.getServerVersion() ?? null });
      if (!denied) await checkedList(true);
      return done;
    };
    client.tallyToolsChanged = () => agent._toolsChanged(check);
    hookListChanged(client, client.tallyToolsChanged);
  }
  const hide = (result, hidden) => {
    const set = new Set(hidden);
    return { ...result, tools: result.tools.filter((t) => !set.has(t.name)) };
  };
  const checkedList = async (initialize) => {
    let result;
    try {
      result = await listTools();
    } catch (err) {
      agent._checkTools(check, initialize, null);
      throw err;
    }
    return hide(result, agent._checkTools(check, initialize, result.tools));
  };
  client.callTool = async (params, ...rest) => {
    if (check) {
      let refused = agent._admitTool(check, params.name);
      if (refused && refused[0] === 'tool_check_pending') {
        await checkedList(false);
        refused = agent._admitTool(check, params.name);
      }
      if (refused) throw new ToolCheckRefused(refused[0], refused[1]);
    }
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
    if (check) return hide(result, agent._checkTools(check, false, result.tools));
    return result;
  };
  return client;
}

module.exports = { recordClient, ToolCheckRefused };
