import type { Agent } from '../index';

/** A copy of `tools` (an AI SDK ToolSet) whose `execute` functions are recorded. */
export declare function recordTools<T extends Record<string, any>>(agent: Agent, tools: T, options?: { strict?: boolean }): T;
