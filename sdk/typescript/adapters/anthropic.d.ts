import type { Agent } from '../index';

type Tools = Record<string, (input: any) => unknown>;

export interface ToolResultMessage {
  role: 'user';
  content: Array<{ type: 'tool_result'; tool_use_id: string; content: string; is_error?: boolean }>;
}

/** The user message of tool_result blocks for `message`'s tool_use blocks, or null. */
export declare function runToolUses(
  agent: Agent,
  message: { content: any[] },
  tools: Tools,
  options?: { strict?: boolean; errorsToModel?: boolean },
): Promise<ToolResultMessage | null>;
