'use strict';
// The Vercel AI SDK adapter (README.md "Adapters"): the tools of a ToolSet
// (`tool({description, inputSchema, execute})`) with each `execute`
// recorded: the model's input before it runs, the result or error after.
// The ToolSet itself is the `ai` package's; nothing of it is reimplemented.

/**
 * A copy of `tools` whose `execute` functions are recorded by `agent`, and
 * declared recorded by `agent.declareTools()` (with their description and
 * JSON schema). Tools without `execute` (the model's client-side tools)
 * are left as they are.
 */
function recordTools(agent, tools, { strict } = {}) {
  const out = {};
  for (const [name, t] of Object.entries(tools)) {
    if (typeof t.execute !== 'function') {
      out[name] = t;
      continue;
    }
    const execute = t.execute;
    agent._recorded(definitionOf(name, t));
    out[name] = {
      ...t,
      // The model's input is what is recorded; the SDK's options (abort
      // signal, messages) are passed through.
      execute: (input, options) =>
        agent.run(name, input, () => execute.call(t, input, options), {
          strict,
          callId: options && options.toolCallId,
        }),
    };
  }
  return out;
}

function definitionOf(name, t) {
  const def = { name };
  if (typeof t.description === 'string') def.description = t.description;
  const schema = jsonSchemaOf(t.inputSchema);
  if (schema !== undefined) def.inputSchema = schema;
  return def;
}

function jsonSchemaOf(schema) {
  if (schema === undefined) return undefined;
  try {
    // The ai package's own conversion (zod, Standard Schema, jsonSchema()).
    const s = require('ai').asSchema(schema).jsonSchema;
    if (s && typeof s.then !== 'function') return JSON.parse(JSON.stringify(s));
  } catch {
    // Declared without its schema.
  }
  return undefined;
}

/**
 * An `onStepFinish` callback for generateText/streamText that checks each
 * step's text for claims of `agent`'s action tools with no call to them
 * (docs/protocol.md §5.6): `generateText({..., onStepFinish: checkSteps(agent)})`.
 */
function checkSteps(agent) {
  return (step) => {
    const called = (step.toolCalls || []).map((c) => c.toolName);
    agent.checkTurn(step.text || '', called, { final: called.length === 0 });
  };
}

module.exports = { recordTools, checkSteps };
