'use strict';
// The Anthropic Node client adapter (README.md "Adapters"): runs the
// `tool_use` blocks of a Message through recorded tools and hands back the
// user message of `tool_result` blocks for the next request of the
// tool-calling loop. The client and its Message are the
// `@anthropic-ai/sdk` package's. Called on every message, the final one
// too, it checks the message's text for claims of the agent's action
// tools with no call to them (docs/protocol.md §5.6).

/**
 * Runs every `tool_use` block of `message`, in order, each recorded by
 * `agent` under its tool use id; `tools` maps a tool name to its
 * implementation, which gets the block's input. Resolves to
 * `{role: 'user', content: [tool_result…]}`, or null when the message
 * asks for no tool. An error a tool throws is rethrown unchanged (after
 * its outcome is recorded); with `errorsToModel`, it is sent back as a
 * `tool_result` with `is_error` instead.
 */
async function runToolUses(agent, message, tools, { strict, errorsToModel = false } = {}) {
  const blocks = (message && message.content) || [];
  const uses = blocks.filter((b) => b.type === 'tool_use');
  const text = blocks.filter((b) => b.type === 'text').map((b) => b.text).join('\n');
  if (uses.length === 0) {
    agent.checkTurn(text, [], { final: true });
    return null;
  }
  const content = [];
  for (const use of uses) {
    const fn = Object.prototype.hasOwnProperty.call(tools, use.name) ? tools[use.name] : undefined;
    if (typeof fn !== 'function') {
      const { Invalid } = require('..');
      throw new Invalid(`the model asked for tool ${JSON.stringify(use.name)}, which is not among the tools given`, 'invalid');
    }
    try {
      const result = await agent.run(use.name, use.input, () => fn(use.input), { strict, callId: use.id });
      content.push({ type: 'tool_result', tool_use_id: use.id, content: typeof result === 'string' ? result : JSON.stringify(result ?? null) });
    } catch (err) {
      const { TallyError } = require('..');
      if (!errorsToModel || err instanceof TallyError) throw err;
      content.push({ type: 'tool_result', tool_use_id: use.id, is_error: true, content: String((err && err.message) || err) });
    }
  }
  agent.checkTurn(text, uses.map((u) => u.name), { final: false });
  return { role: 'user', content };
}

module.exports = { runToolUses };
