'use strict';
// Action tools and claims (docs/protocol.md §5.2 "Action outcomes", §5.6):
// an action's outcome resolves from its own receipt (posted / unknown /
// failed), and a model turn that claims an action with no call to it is
// recorded, through wrapTool and the adapters that see model turns (the
// OpenAI and Anthropic clients against a mock model, the AI SDK with its
// own test model); then `tally verify` states it against the real
// `tally serve`.
const test = require('node:test');
const assert = require('node:assert/strict');
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');
const { generateText, tool, stepCountIs } = require('ai');
const { MockLanguageModelV3 } = require('ai/test');
const { z } = require('zod');
const { Agent, Invalid } = require('..');
const { runToolCalls } = require('../adapters/openai');
const { runToolUses } = require('../adapters/anthropic');
const { recordTools, checkSteps } = require('../adapters/ai');
const { makeAgent, chain, startWitness, exportAndVerify } = require('./helpers');

const SENT = "I've sent the email to the customer.";

const states = (state, name) =>
  chain(state, name)
    .filter((r) => r.kind === 'outcome')
    .map((r) => [r.body.status, r.body.state ?? null, 'proof_hash' in r.body, r.body.proof ?? null]);

function claims(state, name) {
  return chain(state, name)
    .filter((r) => r.kind === 'claim')
    .map((r) => {
      assert.deepEqual(Object.keys(r.body).sort(), ['tool', 'turn_hash']); // not the text
      return [r.seq, r.body.tool];
    });
}

function mockModel(answers) {
  let i = 0;
  return async () => new Response(JSON.stringify(answers[i++]), { status: 200, headers: { 'content-type': 'application/json' } });
}

test('wrapped actions resolve posted, unknown and failed from their own receipts', async (t) => {
  const { state } = makeAgent(t, 'mail-bot');
  const agent = new Agent('mail-bot', { stateDir: state });
  const sendEmail = agent.wrapTool(
    'send_email',
    async ({ to }) => {
      if (to === 'nobody') throw new Error('no such address');
      return to === 'ann' ? { message_id: 'm-1' } : { queued: true };
    },
    { action: true, proof: 'message_id' },
  );
  const charge = agent.wrapTool('charge', (amount) => ({ charge: amount ? { id: 9001 } : null }), {
    action: true,
    proof: (r) => r.charge && r.charge.id,
  });
  const writeRow = agent.wrapTool('write_row', () => ({ receipt: { ids: ['row-1'] } }), { action: true, proof: '$.receipt.ids[0]' });
  const lookup = agent.wrapTool('lookup', () => 'open');
  await sendEmail({ to: 'ann' });
  await sendEmail({ to: 'bob' });
  await assert.rejects(sendEmail({ to: 'nobody' }), /no such address/);
  charge(5);
  charge(0);
  writeRow();
  lookup();
  const handle = await agent.call('send_email', { to: 'dee' });
  handle.outcome({ message_id: 'm-dee' });
  assert.throws(() => agent.wrapTool('x', () => 1, { proof: 'id' }), Invalid);
  assert.throws(() => agent.action('x', { proof: 3 }), Invalid);
  await agent.close();
  assert.deepEqual(states(state, 'mail-bot'), [
    ['ok', 'posted', true, null],
    ['ok', 'unknown', false, null],
    ['error', 'failed', false, null],
    ['ok', 'posted', true, null],
    ['ok', 'unknown', false, null],
    ['ok', 'posted', true, null],
    ['ok', null, false, null],
    ['ok', 'posted', true, null],
  ]);
});

test('proofs in clear', async (t) => {
  const { state } = makeAgent(t, 'clear-bot');
  const agent = new Agent('clear-bot', { stateDir: state, proofInClear: true });
  const post = agent.wrapTool('post', (n) => ({ id: n }), { action: true, proof: 'id' });
  post(42);
  await agent.close();
  assert.deepEqual(states(state, 'clear-bot'), [['ok', 'posted', false, '42']]);
});

test('OpenAI chat loop: a text-only claim is caught, a turn that calls and says so is not', async (t) => {
  const { state } = makeAgent(t, 'openai-bot');
  const agent = new Agent('openai-bot', { stateDir: state });
  agent.action('send_email', { proof: 'message_id' });
  const completion = (message) => ({
    id: 'c', object: 'chat.completion', created: 1, model: 'mock',
    choices: [{ index: 0, message: { role: 'assistant', content: null, refusal: null, ...message }, finish_reason: message.tool_calls ? 'tool_calls' : 'stop', logprobs: null }],
  });
  const client = new OpenAI({
    apiKey: 'test', baseURL: 'http://mock.invalid/v1', maxRetries: 0,
    fetch: mockModel([
      completion({ content: SENT }),
      completion({ content: 'Sending it now.', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'send_email', arguments: '{"to":"ann"}' } }] }),
      completion({ content: SENT }),
    ]),
  });
  const tools = { send_email: async () => ({ message_id: 'm-1' }) };
  for (let turn = 0; turn < 3; turn++) {
    const response = await client.chat.completions.create({ model: 'mock', messages: [{ role: 'user', content: 'email ann' }] });
    await runToolCalls(agent, response, tools);
  }
  // The Responses API: a bare claim is caught.
  await runToolCalls(agent, { output: [{ type: 'message', content: [{ type: 'output_text', text: 'The email was sent.' }] }] }, tools);
  await agent.close();
  assert.deepEqual(claims(state, 'openai-bot').map(([, tool]) => tool), ['send_email', 'send_email']);
  assert.deepEqual(states(state, 'openai-bot'), [['ok', 'posted', true, null]]);
});

test('Anthropic loop: declared phrases, a negation is no claim', async (t) => {
  const { state } = makeAgent(t, 'claude-bot');
  const agent = new Agent('claude-bot', { stateDir: state });
  agent.action('charge_card', { proof: 'charge_id', phrases: ['payment went through'] });
  const message = (content) => ({
    id: 'msg', type: 'message', role: 'assistant', model: 'mock', content,
    stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 1, output_tokens: 1 },
  });
  const text = (t) => ({ type: 'text', text: t });
  const client = new Anthropic({
    apiKey: 'test', baseURL: 'http://mock.invalid', maxRetries: 0,
    fetch: mockModel([
      message([text('Good news: your payment went through!')]),
      message([text('Charging now.'), { type: 'tool_use', id: 'toolu_1', name: 'charge_card', input: { amount: 5 } }]),
      message([text('I charged your card; the payment went through.')]),
      message([text('I have not charged your card yet.')]),
    ]),
  });
  const tools = { charge_card: () => ({ charge_id: 'ch_1' }) };
  const results = [];
  for (let turn = 0; turn < 4; turn++) {
    const response = await client.messages.create({ model: 'mock', max_tokens: 10, messages: [{ role: 'user', content: 'pay' }] });
    results.push(await runToolUses(agent, response, tools));
  }
  assert.deepEqual(results.map((r) => r && r.content.length), [null, 1, null, null]);
  await agent.close();
  assert.deepEqual(claims(state, 'claude-bot').map(([, tool]) => tool), ['charge_card']);
});

test('AI SDK: checkSteps on generateText with the mock model', async (t) => {
  const { state } = makeAgent(t, 'ai-bot');
  const agent = new Agent('ai-bot', { stateDir: state, source: 'ai' });
  agent.action('send_email', { proof: 'message_id' });
  const tools = recordTools(agent, {
    send_email: tool({
      description: 'sends an email',
      inputSchema: z.object({ to: z.string() }),
      execute: async () => ({ message_id: 'm-1' }),
    }),
  });
  const usage = {
    inputTokens: { total: 3, noCache: 3, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: 5, text: 5, reasoning: undefined },
  };
  const turns = [
    [{ type: 'tool-call', toolCallId: 'call-1', toolName: 'send_email', input: JSON.stringify({ to: 'ann' }) }],
    [{ type: 'text', text: SENT }],
    [{ type: 'text', text: SENT }],
  ];
  const model = new MockLanguageModelV3({
    doGenerate: async () => {
      const content = turns.shift();
      const calls = content[0].type === 'tool-call';
      return { content, finishReason: { unified: calls ? 'tool-calls' : 'stop', raw: 'x' }, usage, warnings: [] };
    },
  });
  const onStepFinish = checkSteps(agent);
  const first = await generateText({ model, tools, prompt: 'email ann', stopWhen: stepCountIs(3), onStepFinish });
  assert.equal(first.text, SENT);
  await generateText({ model, tools, prompt: 'email bob', stopWhen: stepCountIs(3), onStepFinish });
  await agent.close();
  assert.deepEqual(claims(state, 'ai-bot').map(([, tool]) => tool), ['send_email']);
  assert.deepEqual(states(state, 'ai-bot'), [['ok', 'posted', true, null]]);
});

test('the exported pack verifies and states the actions and the claim', async (t) => {
  const witness = await startWitness(t);
  const { state, vkey } = makeAgent(t, 'mail-bot', witness);
  const agent = new Agent('mail-bot', { stateDir: state, source: 'mail' });
  const sendEmail = agent.wrapTool(
    'send_email',
    ({ to }) => {
      if (to === 'nobody') throw new Error('no such address');
      return to === 'ann' ? { message_id: 'm-1' } : {};
    },
    { action: true, proof: 'message_id' },
  );
  await agent.declareTools(['send_email']);
  sendEmail({ to: 'ann' });
  sendEmail({ to: 'bob' });
  assert.throws(() => sendEmail({ to: 'nobody' }), /no such address/);
  assert.deepEqual(agent.checkTurn(SENT), []); // after calls in this exchange
  assert.deepEqual(agent.checkTurn(SENT), ['send_email']);
  const synced = await agent.sync({ timeout: 60_000 });
  assert.equal(synced.complete, true, synced.error);
  await agent.close();
  const [[seq]] = claims(state, 'mail-bot');
  const verified = exportAndVerify(t, 'mail-bot', witness, vkey, state);
  const out = verified.stdout + verified.stderr;
  assert.equal(verified.status, 0, out);
  assert.match(out, /\ncoverage: mail-bot: action calls: 1 posted, 1 unknown, 1 failed\n/, out);
  assert.ok(out.includes(`\ncoverage: mail-bot: 1 claim without a call: send_email at seq ${seq}\n`), out);
});
