'use strict';
// The OpenAI Node client adapter (README.md "Adapters"): runs the tool
// calls of a response through recorded tools and hands back the messages
// (Chat Completions) or input items (Responses) that carry their results
// to the next request of the tool-calling loop. The client and its
// response objects are the `openai` package's. Called on every response,
// the final one too, it checks the response's text for claims of the
// agent's action tools with no call to them (docs/protocol.md §5.6).

function content(result) {
  return typeof result === 'string' ? result : JSON.stringify(result ?? null);
}

function parsed(name, text) {
  try {
    return JSON.parse(text || '{}');
  } catch (e) {
    const { BadContent } = require('..');
    throw new BadContent(`the model's arguments for ${name} are not JSON: ${e.message}`, 'bad_content', { cause: e });
  }
}

function toolOf(tools, name) {
  const fn = Object.prototype.hasOwnProperty.call(tools, name) ? tools[name] : undefined;
  if (typeof fn !== 'function') {
    const { Invalid } = require('..');
    throw new Invalid(`the model asked for tool ${JSON.stringify(name)}, which is not among the tools given`, 'invalid');
  }
  return fn;
}

/**
 * Runs every tool call of `response` (a ChatCompletion or a Responses API
 * Response), in order, each recorded by `agent` under its tool call id;
 * `tools` maps a function name to its implementation, which gets the
 * parsed arguments. Resolves to the tool messages (Chat Completions) or
 * `function_call_output` items (Responses) to send back; an error a tool
 * throws is rethrown unchanged (after its outcome is recorded).
 */
async function runToolCalls(agent, response, tools, { strict } = {}) {
  const out = [];
  const called = [];
  const text = [];
  if (Array.isArray(response && response.choices)) {
    const message = (response.choices[0] && response.choices[0].message) || {};
    if (typeof message.content === 'string') text.push(message.content);
    for (const call of message.tool_calls || []) {
      if (call.type !== 'function') continue;
      const name = call.function.name;
      called.push(name);
      const fn = toolOf(tools, name);
      const args = parsed(name, call.function.arguments);
      const result = await agent.run(name, args, () => fn(args), { strict, callId: call.id });
      out.push({ role: 'tool', tool_call_id: call.id, content: content(result) });
    }
  } else {
    for (const item of (response && response.output) || []) {
      if (item.type === 'message') {
        for (const c of item.content || []) if (c.type === 'output_text') text.push(c.text);
      }
      if (item.type !== 'function_call') continue;
      called.push(item.name);
      const fn = toolOf(tools, item.name);
      const args = parsed(item.name, item.arguments);
      const result = await agent.run(item.name, args, () => fn(args), { strict, callId: item.call_id });
      out.push({ type: 'function_call_output', call_id: item.call_id, output: content(result) });
    }
  }
  agent.checkTurn(text.join('\n'), called, { final: called.length === 0 });
  return out;
}

module.exports = { runToolCalls };
