import type { Agent } from '../index';

/** Records `client.callTool` and declares what `client.listTools` returns; returns `client`. */
export declare function recordClient<C extends { callTool: (...a: any[]) => Promise<any>; listTools: (...a: any[]) => Promise<any> }>(
  agent: Agent,
  client: C,
  options?: {
    strict?: boolean;
    /** An approved baseline (`tally tools approve`), with `policy`: enforced as `tally gateway --lock --policy` does. */
    lock?: string;
    policy?: string;
    /** The server as approved: its command and arguments, or `url`. */
    command?: string[];
    url?: string;
  },
): C & { /** The same as the list_changed the client takes itself. */ tallyToolsChanged?: () => void };

/** A call the tool check refused (`reason`: tool_paused, session_paused, session_denied); it did not run. */
export declare class ToolCheckRefused extends Error {
  readonly code: 'tool_check_refused';
  readonly reason: string;
}
