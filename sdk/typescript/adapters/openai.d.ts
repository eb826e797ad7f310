import type { Agent } from '../index';

type Tools = Record<string, (args: any) => unknown>;

/** Chat Completions: the tool messages; Responses: the function_call_output items. */
export declare function runToolCalls(
  agent: Agent,
  response: { choices: any[] } | { output: any[] },
  tools: Tools,
  options?: { strict?: boolean },
): Promise<Array<{ role: 'tool'; tool_call_id: string; content: string } | { type: 'function_call_output'; call_id: string; output: string }>>;
