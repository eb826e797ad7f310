// Types of tally-agent (README.md). The implementation is index.js over
// the native addon tally.node.

export interface AgentOptions {
  /** The state folder; default: TALLY_STATE_DIR, else ./.tally (as the CLI). */
  stateDir?: string;
  /** The tool source the program declares its tools under; default `sdk-node:<script name>`. */
  source?: string;
  /** How long a declaration holds, in ms (default: the protocol's). */
  sourceLeaseMs?: number;
  /** Wait for each decision's accepted witness receipt before a call runs. */
  strict?: boolean;
  /** How long strict waits for a receipt, in ms (default 10000). */
  strictTimeoutMs?: number;
  /** Keep arguments and results in the local store (salts are always kept). */
  storeContent?: boolean;
  /** Answer a record only once it is committed with fsync. */
  durable?: boolean;
  /** Put action tools' proofs in their outcomes in clear, not salted-hashed. */
  proofInClear?: boolean;
}

/** How an action tool's proof is read from its result: a member name or path, or a function. */
export type Proof = string | ((result: any) => unknown) | null;

export interface ActionOptions {
  /** Where the proof is in the result (`'message_id'`, `'$.receipt.ids[0]'`), or a function of the result. */
  proof?: Proof;
  /** Phrases a model turn uses to claim the action was done. */
  phrases?: string[];
}

export interface WrapOptions {
  /** Overrides the agent's strict for this tool. */
  strict?: boolean;
  /** Declared with the tool (declareTools). */
  description?: string;
  /** Declared with the tool (declareTools). */
  inputSchema?: unknown;
  /** A side-effecting tool: its outcomes carry posted / unknown / failed (with proof, phrases). */
  action?: boolean;
  /** With action: where its proof is. */
  proof?: Proof;
  /** With action: phrases that claim it was done. */
  phrases?: string[];
}

/** A tool to declare: its name, or an MCP-style definition. */
export type ToolDefinition = string | { name: string; description?: string; inputSchema?: unknown; [key: string]: unknown };

export interface SyncResult {
  /** Every record has an accepted receipt. */
  complete: boolean;
  /** Records in the chain. */
  records: number;
  /** Records without a receipt. */
  pending: number;
  /** Why not complete: `[code] message`. */
  error?: string | null;
}

/** The outcome statuses of docs/protocol.md §5.2. */
export type OutcomeStatus = 'ok' | 'error' | 'cancelled' | 'server_exited' | 'client_gone' | 'timeout' | 'http_error' | 'not_run';

type AnyFn = (...args: any[]) => any;
/** A wrapped function: async functions and strict tools return a promise. */
export type Wrapped<F extends AnyFn> = F extends (...args: infer A) => infer R
  ? (...args: A) => R extends PromiseLike<any> ? R : R | Promise<Awaited<R>>
  : never;

export declare class CallHandle {
  readonly callId: string;
  readonly tool: string;
  readonly seq: number;
  readonly decision: string;
  /** Records that the call returned `result`. */
  outcome(result: unknown): void;
  /** Records that the call failed with `err`. */
  error(err: unknown): void;
  /** Records another status with an optional output. */
  status(status: OutcomeStatus, output?: unknown): void;
}

export declare class Agent {
  constructor(name: string, options?: AgentOptions);
  readonly name: string;
  readonly source: string;
  wrapTool<F extends AnyFn>(name: string, fn: F, options?: WrapOptions): Wrapped<F>;
  wrapTools<T extends Record<string, AnyFn>>(tools: T, options?: WrapOptions): { [K in keyof T]: Wrapped<T[K]> };
  declareTools(tools?: ToolDefinition[]): Promise<boolean>;
  call(tool: string, args: unknown, options?: { callId?: string; strict?: boolean }): Promise<CallHandle>;
  /** Records one call of `tool` with `args` around `fn()`. */
  run<R>(tool: string, args: unknown, fn: () => R | PromiseLike<R>, options?: { callId?: string; strict?: boolean }): Promise<Awaited<R>>;
  /** Marks `name` as an action tool (docs/protocol.md §5.2). */
  action(name: string, options?: ActionOptions): void;
  /** Records a claim for each action tool `text` claims with no call to it; returns their names. */
  checkTurn(text: string | null | undefined, called?: string[], options?: { final?: boolean }): string[];
  note(text: string): Promise<number>;
  sync(options?: { timeout?: number }): Promise<SyncResult>;
  status(): Promise<Record<string, unknown>>;
  close(): Promise<void>;
  closeSync(): void;
}

export type ErrorCode = 'agent_not_found' | 'bad_content' | 'invalid' | 'not_recorded' | 'no_receipt' | 'closed' | 'panic';

export declare class TallyError extends Error {
  readonly code: ErrorCode;
}
export declare class AgentNotFound extends TallyError {}
export declare class BadContent extends TallyError {}
export declare class Invalid extends TallyError {}
export declare class NotRecorded extends TallyError {}
export declare class NoReceipt extends TallyError {}
export declare class Closed extends TallyError {}
