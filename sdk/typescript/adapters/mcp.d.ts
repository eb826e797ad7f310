import type { Agent } from '../index';

/** Records `client.callTool` and declares what `client.listTools` returns; returns `client`. */
export declare function recordClient<C extends { callTool: (...a: any[]) => Promise<any>; listTools: (...a: any[]) => Promise<any> }>(
  agent: Agent,
  client: C,
  options?: { strict?: boolean },
): C;
