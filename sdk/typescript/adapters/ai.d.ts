import type { Agent } from '../index';

/** A copy of `tools` (an AI SDK ToolSet) whose `execute` functions are recorded. */
export declare function recordTools<T extends Record<string, any>>(agent: Agent, tools: T, options?: { strict?: boolean }): T;

/** An onStepFinish callback that records claims of `agent`'s action tools with no call (docs/protocol.md §5.6). */
export declare function checkSteps(agent: Agent): (step: { text?: string; toolCalls?: Array<{ toolName: string }> }) => void;
