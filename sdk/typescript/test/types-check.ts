// Compiled (not run) by test/types.test.js: the declarations in index.d.ts
// and adapters/*.d.ts accept the README's uses and refuse wrong ones.
import { Agent, TallyError, NotRecorded, type SyncResult, type CallHandle } from 'tally-agent';
import { recordTools } from 'tally-agent/adapters/ai';
import { runToolCalls } from 'tally-agent/adapters/openai';
import { runToolUses } from 'tally-agent/adapters/anthropic';
import { recordClient } from 'tally-agent/adapters/mcp';

const agent = new Agent('claims-bot', { stateDir: '.tally', strict: false, storeContent: true });
const lookup = agent.wrapTool('lookup', (id: number) => ({ id, amount: 1 }));
const r: { id: number; amount: number } | Promise<{ id: number; amount: number }> = lookup(7);
const tools = agent.wrapTools({ refund: async (id: number) => id > 0 });
const p: Promise<boolean> = tools.refund(3);
const declared: Promise<boolean> = agent.declareTools(['lookup', { name: 'escalate', description: 'x' }]);
const handle: Promise<CallHandle> = agent.call('shell', { cmd: 'ls' });
handle.then((h) => {
  h.outcome(['a']);
  h.status('cancelled');
  const seq: number = h.seq;
  return seq;
});
const synced: Promise<SyncResult> = agent.sync({ timeout: 5000 });
const ran: Promise<number> = agent.run('f', {}, () => 1);
const e: TallyError = new NotRecorded('x');
const code: string = e.code;
recordTools(agent, { weather: { description: 'w', execute: async () => 1 } });
runToolCalls(agent, { choices: [] }, { lookup: (a: { id: number }) => a.id });
runToolUses(agent, { content: [] }, {}, { errorsToModel: true });
recordClient(agent, { callTool: async () => ({}), listTools: async () => ({ tools: [] }) });
// @ts-expect-error a tool name is a string
agent.wrapTool(7, () => 1);
// @ts-expect-error the status is one of docs/protocol.md §5.2's
handle.then((h) => h.status('exploded'));
// @ts-expect-error wrapped arguments keep their types
lookup('seven');
export { r, p, declared, synced, ran, code };
