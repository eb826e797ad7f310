'use strict';
// The Vercel AI SDK adapter with the real `ai` package (pinned) and its own
// test model, MockLanguageModelV3 from `ai/test`: generateText runs the
// tool calls the mock asks for through recorded tools.
const test = require('node:test');
const assert = require('node:assert/strict');
const { generateText, tool, stepCountIs } = require('ai');
const { MockLanguageModelV3 } = require('ai/test');
const { z } = require('zod');
const { Agent } = require('..');
const { recordTools } = require('../adapters/ai');
const { makeAgent, chain } = require('./helpers');

const usage = {
  inputTokens: { total: 3, noCache: 3, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

test('generateText with a mock model: each tool call the model asks for is recorded', async (t) => {
  const { state } = makeAgent(t, 'ai-bot');
  const agent = new Agent('ai-bot', { stateDir: state, source: 'ai' });
  const tools = recordTools(agent, {
    weather: tool({
      description: 'the weather in a city',
      inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => ({ city, celsius: 21 }),
    }),
    explode: tool({
      description: 'always fails',
      inputSchema: z.object({}),
      execute: async () => {
        throw new Error('kaboom');
      },
    }),
  });
  let step = 0;
  const model = new MockLanguageModelV3({
    doGenerate: async () => {
      step += 1;
      if (step === 1) {
        return {
          content: [
            { type: 'tool-call', toolCallId: 'call-w', toolName: 'weather', input: JSON.stringify({ city: 'Lyon' }) },
            { type: 'tool-call', toolCallId: 'call-x', toolName: 'explode', input: '{}' },
          ],
          finishReason: { unified: 'tool-calls', raw: 'tool_calls' },
          usage,
          warnings: [],
        };
      }
      return { content: [{ type: 'text', text: 'It is 21 degrees in Lyon.' }], finishReason: { unified: 'stop', raw: 'stop' }, usage, warnings: [] };
    },
  });
  const result = await generateText({ model, tools, prompt: 'Weather in Lyon?', stopWhen: stepCountIs(3) });
  assert.equal(result.text, 'It is 21 degrees in Lyon.');
  const results = result.steps[0].content.filter((c) => c.type === 'tool-result' || c.type === 'tool-error');
  assert.deepEqual(
    results.map((c) => [c.type, c.toolName]),
    [
      ['tool-result', 'weather'],
      ['tool-error', 'explode'],
    ],
  );
  assert.deepEqual(results[0].output, { city: 'Lyon', celsius: 21 });
  assert.equal(await agent.declareTools(['search']), true);
  await agent.close();

  const records = chain(state, 'ai-bot');
  const calls = records.filter((r) => r.kind !== 'tools').map((r) => [r.kind, r.body.call_id, r.body.tool ?? r.body.status]);
  assert.deepEqual(calls.slice(0, 2).sort(), [
    ['decision', 'call-w', 'weather'],
    ['decision', 'call-x', 'explode'],
  ]);
  assert.deepEqual(calls.slice(2).sort(), [
    ['outcome', 'call-w', 'ok'],
    ['outcome', 'call-x', 'error'],
  ]);
  const list = records.find((r) => r.kind === 'tools').body;
  assert.deepEqual(
    list.tools.map((x) => [x.name, x.recorded, Object.keys(x.parts).sort()]),
    [
      ['search', false, []],
      ['weather', true, ['description', 'input_schema']],
      ['explode', true, ['description', 'input_schema']],
    ],
  );
});
