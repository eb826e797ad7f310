'use strict';
// The OpenAI and Anthropic Node clients (pinned), each driving a
// tool-calling loop against a mock model: the client's own `fetch` option
// answers as the API would, so the responses are parsed into the SDKs' own
// objects, with no network. Tool calls run through recorded tools.
const test = require('node:test');
const assert = require('node:assert/strict');
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');
const { Agent } = require('..');
const { runToolCalls } = require('../adapters/openai');
const { runToolUses } = require('../adapters/anthropic');
const { makeAgent, chain } = require('./helpers');

// A model that answers each request with the next of `answers`, and keeps
// what it was sent.
function mockModel(answers) {
  const sent = [];
  const fetch = async (url, init) => {
    sent.push({ url: String(url), body: JSON.parse(init.body) });
    const answer = answers[sent.length - 1];
    return new Response(JSON.stringify(answer), { status: 200, headers: { 'content-type': 'application/json' } });
  };
  return { fetch, sent };
}

const calls = (state, name) =>
  chain(state, name).map((r) => [r.kind, r.body.call_id, r.body.tool ?? r.body.status]);

test('OpenAI chat completions: the tool-calling loop runs the calls through recorded tools', async (t) => {
  const { state } = makeAgent(t, 'openai-bot');
  const agent = new Agent('openai-bot', { stateDir: state });
  const completion = (message, finish) => ({
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1,
    model: 'mock',
    choices: [{ index: 0, message: { role: 'assistant', content: null, refusal: null, ...message }, finish_reason: finish, logprobs: null }],
  });
  const model = mockModel([
    completion(
      {
        tool_calls: [
          { id: 'call_1', type: 'function', function: { name: 'lookup', arguments: '{"id":7}' } },
          { id: 'call_2', type: 'function', function: { name: 'lookup', arguments: '{"id":8}' } },
        ],
      },
      'tool_calls',
    ),
    completion({ content: 'Claim 7 is 70, claim 8 is 80.' }, 'stop'),
  ]);
  const client = new OpenAI({ apiKey: 'test', baseURL: 'http://mock.invalid/v1', fetch: model.fetch, maxRetries: 0 });
  const tools = { lookup: async ({ id }) => ({ id, amount: id * 10 }) };
  const messages = [{ role: 'user', content: 'claims 7 and 8?' }];
  let response;
  for (;;) {
    response = await client.chat.completions.create({ model: 'mock', messages, tools: [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object' } } }] });
    const msg = response.choices[0].message;
    if (!msg.tool_calls) break;
    messages.push(msg, ...(await runToolCalls(agent, response, tools)));
  }
  assert.equal(response.choices[0].message.content, 'Claim 7 is 70, claim 8 is 80.');
  assert.deepEqual(model.sent[1].body.messages.slice(2), [
    { role: 'tool', tool_call_id: 'call_1', content: '{"id":7,"amount":70}' },
    { role: 'tool', tool_call_id: 'call_2', content: '{"id":8,"amount":80}' },
  ]);
  // The Responses API's function calls too.
  const items = await runToolCalls(agent, { output: [{ type: 'function_call', call_id: 'fc_1', name: 'lookup', arguments: '{"id":9}' }] }, tools);
  assert.deepEqual(items, [{ type: 'function_call_output', call_id: 'fc_1', output: '{"id":9,"amount":90}' }]);
  await assert.rejects(runToolCalls(agent, { output: [{ type: 'function_call', call_id: 'fc_2', name: 'delete_all', arguments: '{}' }] }, tools), /not among the tools/);
  await agent.close();
  assert.deepEqual(calls(state, 'openai-bot'), [
    ['decision', 'call_1', 'lookup'],
    ['outcome', 'call_1', 'ok'],
    ['decision', 'call_2', 'lookup'],
    ['outcome', 'call_2', 'ok'],
    ['decision', 'fc_1', 'lookup'],
    ['outcome', 'fc_1', 'ok'],
  ]);
});

test('Anthropic messages: tool_use blocks run through recorded tools, errors rethrown or sent back', async (t) => {
  const { state } = makeAgent(t, 'claude-bot');
  const agent = new Agent('claude-bot', { stateDir: state });
  const message = (content, stop) => ({
    id: 'msg_1',
    type: 'message',
    role: 'assistant',
    model: 'mock',
    content,
    stop_reason: stop,
    stop_sequence: null,
    usage: { input_tokens: 1, output_tokens: 1 },
  });
  const model = mockModel([
    message(
      [
        { type: 'text', text: 'Let me look.' },
        { type: 'tool_use', id: 'toolu_1', name: 'lookup', input: { id: 3 } },
        { type: 'tool_use', id: 'toolu_2', name: 'refund', input: { id: 3 } },
      ],
      'tool_use',
    ),
    message([{ type: 'text', text: 'Claim 3 is 30; the refund failed.' }], 'end_turn'),
  ]);
  const client = new Anthropic({ apiKey: 'test', baseURL: 'http://mock.invalid', fetch: model.fetch, maxRetries: 0 });
  class RefundRefused extends Error {}
  const tools = {
    lookup: ({ id }) => ({ id, amount: id * 10 }),
    refund: () => {
      throw new RefundRefused('over the limit');
    },
  };
  const messages = [{ role: 'user', content: 'claim 3?' }];
  let response;
  for (;;) {
    response = await client.messages.create({ model: 'mock', max_tokens: 100, messages, tools: [{ name: 'lookup', input_schema: { type: 'object' } }] });
    const results = await runToolUses(agent, response, tools, { errorsToModel: true });
    if (!results) break;
    messages.push({ role: 'assistant', content: response.content }, results);
  }
  assert.equal(response.content[0].text, 'Claim 3 is 30; the refund failed.');
  assert.deepEqual(model.sent[1].body.messages[2], {
    role: 'user',
    content: [
      { type: 'tool_result', tool_use_id: 'toolu_1', content: '{"id":3,"amount":30}' },
      { type: 'tool_result', tool_use_id: 'toolu_2', is_error: true, content: 'over the limit' },
    ],
  });
  // Without errorsToModel the tool's error is rethrown unchanged.
  await assert.rejects(runToolUses(agent, message([{ type: 'tool_use', id: 'toolu_3', name: 'refund', input: {} }], 'tool_use'), tools), RefundRefused);
  await agent.close();
  assert.deepEqual(calls(state, 'claude-bot'), [
    ['decision', 'toolu_1', 'lookup'],
    ['outcome', 'toolu_1', 'ok'],
    ['decision', 'toolu_2', 'refund'],
    ['outcome', 'toolu_2', 'error'],
    ['decision', 'toolu_3', 'refund'],
    ['outcome', 'toolu_3', 'error'],
  ]);
});
