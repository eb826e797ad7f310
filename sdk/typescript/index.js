'use strict';
// tally-agent: records a Node program's tool calls in its agent's tally
// chain (README.md). The protocol (canonical JSON, hashes, signing, the
// chain, sync) is tally's Rust core, loaded as tally.node (src/lib.rs);
// this file adds the JavaScript idioms: wrapped functions, promises,
// error classes, and closing the agent when the process exits.
const path = require('node:path');

let native;
try {
  native = require('./tally.node');
} catch (e) {
  throw new Error(
    `tally-agent: the native addon ${path.join(__dirname, 'tally.node')} cannot be loaded (${e.message}); ` +
      `build it with \`node build.js\` in ${__dirname} (needs Rust)`,
    { cause: e },
  );
}

/** The base class of every error tally-agent throws; `code` is stable. */
class TallyError extends Error {
  constructor(message, code, options) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}
/** The agent has no key or configuration where the SDK looked (the message says where). */
class AgentNotFound extends TallyError {}
/** Arguments or a result that is not JSON tally can hash. */
class BadContent extends TallyError {}
/** A name, text or option the protocol or the SDK refuses. */
class Invalid extends TallyError {}
/** The decision could not be recorded: the call did not run. */
class NotRecorded extends TallyError {}
/** strict: no accepted witness receipt for the decision; the call did not run. */
class NoReceipt extends TallyError {}
/** The agent was closed. */
class Closed extends TallyError {}

const BY_CODE = {
  agent_not_found: AgentNotFound,
  bad_content: BadContent,
  invalid: Invalid,
  not_recorded: NotRecorded,
  no_receipt: NoReceipt,
  closed: Closed,
};

function make(code, message, options) {
  const Class = BY_CODE[code] || TallyError;
  return new Class(message, code, options);
}

// The addon's errors start with `[code]` (src/lib.rs); an error from napi's
// argument conversion has none and is a caller's mistake.
function fromNative(e) {
  if (e instanceof TallyError) return e;
  const m = /^\[([a-z_]+)\] ([\s\S]*)$/.exec(e && e.message);
  if (m) return make(m[1], m[2]);
  return make('invalid', String((e && e.message) || e), { cause: e });
}

function serialise(value, what) {
  let json;
  try {
    json = JSON.stringify(value);
  } catch (e) {
    throw make('bad_content', `${what} cannot be recorded: ${e.message}`, { cause: e });
  }
  // undefined, a function or a symbol: JSON has no such value.
  return json === undefined ? 'null' : json;
}

function errorOutput(err) {
  if (err instanceof Error) return { error: { name: err.name, message: String(err.message) } };
  return { error: { message: String(err) } };
}

function warn(message) {
  process.emitWarning(message, { type: 'TallyWarning' });
}

function isThenable(v) {
  return v !== null && (typeof v === 'object' || typeof v === 'function') && typeof v.then === 'function';
}

const AsyncFunction = (async () => {}).constructor;

// Open agents, closed when the process exits: their queued outcomes are
// committed and the chain handed on. The native agent holds no libuv
// handle, so it never keeps the process alive by itself.
const open = new Set();
process.on('exit', () => {
  for (const agent of open) agent.closeSync();
});

function defaultSource() {
  const script = process.argv[1];
  if (!script) return 'sdk-node';
  return `sdk-node:${path.basename(script).replace(/\.[cm]?[jt]s$/, '')}`;
}

/** A decision recorded for code that is not a function: `agent.call()`. */
class CallHandle {
  #agent;
  #call;
  #done = false;
  constructor(agent, call) {
    this.#agent = agent;
    this.#call = call;
  }
  /** The call id. */
  get callId() {
    return this.#call.callId;
  }
  /** The tool. */
  get tool() {
    return this.#call.tool;
  }
  /** The decision's seq in the chain. */
  get seq() {
    return this.#call.seq;
  }
  /** The decision's record hash (hex). */
  get decision() {
    return this.#call.decision;
  }
  /** Records that the call returned `result`. */
  outcome(result) {
    this.#finish('ok', serialise(result, `the result of ${this.tool}`), result);
  }
  /** Records that the call failed with `err`. */
  error(err) {
    this.#finish('error', serialise(errorOutput(err), `the error of ${this.tool}`));
  }
  /** Records another status of docs/protocol.md §5.2 (`cancelled`, `timeout`, `not_run`, …). */
  status(status, output) {
    this.#finish(status, output === undefined ? null : serialise(output, `the output of ${this.tool}`));
  }
  #finish(status, json, value) {
    if (this.#done) throw make('invalid', `the outcome of call ${this.callId} is already recorded`);
    this.#done = true;
    this.#agent._outcome(this.#call, status, json, true, value);
  }
}

/** One writer of an agent's tally chain (README.md). */
class Agent {
  #native;
  #strict;
  #strictTimeoutMs;
  #wrapped = new Map();
  #closed = false;
  // Action tools by name: {proof, phrases} (docs/protocol.md §5.2).
  #actions = new Map();
  // Action tools called since the last final model turn (§5.6): a final
  // answer that says so after the call is no claim.
  #calledActions = new Set();

  /**
   * Opens `name`'s state (options.stateDir, else TALLY_STATE_DIR, else
   * ./.tally), as the CLI does.
   */
  constructor(name, options = {}) {
    if (typeof name !== 'string') throw make('invalid', `the agent name must be a string, not ${typeof name}`);
    const {
      stateDir,
      source = defaultSource(),
      strict = false,
      strictTimeoutMs = 10_000,
      storeContent = false,
      durable = false,
      sourceLeaseMs,
      proofInClear = false,
    } = options;
    this.#strict = Boolean(strict);
    this.#strictTimeoutMs = strictTimeoutMs;
    try {
      this.#native = new native.NativeAgent(name, {
        stateDir: stateDir === undefined ? undefined : String(stateDir),
        source,
        sourceLeaseMs,
        storeContent: Boolean(storeContent),
        proofInClear: Boolean(proofInClear),
        durable: Boolean(durable),
      });
    } catch (e) {
      throw fromNative(e);
    }
    open.add(this);
  }

  /** The agent's name. */
  get name() {
    return this.#native.agent;
  }

  /** The tool source this program declares its tools under. */
  get source() {
    return this.#native.source;
  }

  /**
   * Records the decision to call `tool` with `args` and resolves once it
   * is durable in the chain, then (strict) once its receipt is accepted.
   */
  async call(tool, args, { callId, strict } = {}) {
    const call = await this.#decide(tool, args, callId);
    await this.#strictWait(call, strict);
    return new CallHandle(this, call);
  }

  /**
   * Wraps `fn` so that each call is recorded: the decision before it
   * runs (fail closed), the outcome after. Sync functions stay sync
   * unless strict; async functions (and strict ones) return a promise.
   */
  wrapTool(name, fn, options = {}) {
    if (typeof name !== 'string') throw make('invalid', `a tool name must be a string, not ${typeof name}`);
    if (typeof fn !== 'function') throw make('invalid', `tool ${name}: ${typeof fn} is not a function`);
    const { strict, description, inputSchema, action = false, proof, phrases } = options;
    if ((proof !== undefined || phrases !== undefined) && !action) {
      throw make('invalid', `tool ${name}: proof and phrases are for action tools: add action: true`);
    }
    if (action) this.action(name, { proof, phrases });
    const definition = { name };
    if (description !== undefined) definition.description = description;
    if (inputSchema !== undefined) definition.inputSchema = inputSchema;
    this.#wrapped.set(name, definition);
    const agent = this;
    const useStrict = strict === undefined ? () => agent.#strict : () => Boolean(strict);
    let wrapper;
    if (useStrict()) {
      wrapper = async function (...args) {
        const call = await agent.#decide(name, argsOf(args));
        await agent.#strictWait(call, strict);
        return agent.#run(call, () => fn.apply(this, args));
      };
    } else if (fn instanceof AsyncFunction) {
      // The decision is journaled inline, as for a sync function (tens of
      // microseconds): a hop to the thread pool and back would cost more
      // than the recording (docs/benchmarks.md "TypeScript SDK").
      wrapper = async function (...args) {
        const call = agent.#decideSync(name, argsOf(args));
        await agent.#strictWait(call, strict);
        return agent.#run(call, () => fn.apply(this, args));
      };
    } else {
      wrapper = function (...args) {
        const call = agent.#decideSync(name, argsOf(args));
        return agent.#run(call, () => fn.apply(this, args));
      };
    }
    Object.defineProperty(wrapper, 'name', { value: fn.name || name });
    return wrapper;
  }

  /**
   * Records one call of `tool` with `args` around `fn()` (what wrapTool
   * does, for code that has its arguments apart from the function, as the
   * adapters do): resolves to what `fn` returns, rejects with what it throws.
   */
  async run(tool, args, fn, { callId, strict } = {}) {
    if (typeof fn !== 'function') throw make('invalid', `tool ${tool}: ${typeof fn} is not a function`);
    const call = await this.#decide(tool, args, callId);
    await this.#strictWait(call, strict);
    return this.#run(call, fn);
  }

  /**
   * Marks tool `name` as an action (docs/protocol.md §5.2): its outcomes
   * carry `posted` (the proof found in the result), `unknown` (none) or
   * `failed`; `proof` is a member name or path of the result
   * (`'message_id'`, `'$.receipt.ids[0]'`) or a function of the result
   * returning the proof. A model turn the adapters see that claims it was
   * done, by its name or one of `phrases`, with no call to it, is recorded
   * as a claim (§5.6). `wrapTool(name, fn, {action: true, proof})` does
   * this for a wrapped function.
   */
  action(name, { proof, phrases = [] } = {}) {
    if (typeof name !== 'string') throw make('invalid', `a tool name must be a string, not ${typeof name}`);
    if (proof !== undefined && proof !== null && typeof proof !== 'string' && typeof proof !== 'function') {
      throw make('invalid', `tool ${name}: proof must be a member name or path, or a function of the result`);
    }
    if (proof === '') throw make('invalid', `tool ${name}: the proof path is empty`);
    const list = typeof phrases === 'string' ? [phrases] : [...phrases];
    if (!list.every((p) => typeof p === 'string')) throw make('invalid', `tool ${name}: phrases are strings`);
    this.#actions.set(name, { proof: proof ?? null, phrases: list });
  }

  /**
   * Checks a model turn's text against the action tools (docs/protocol.md
   * §5.6): each one it claims was done that neither the turn (`called`,
   * the names of its tool calls) nor a call recorded by this agent since
   * the last final turn called is recorded as a claim; returns their
   * names. `final` (default true): the turn ends the exchange (no tool
   * calls), so the calls seen so far are forgotten after it.
   */
  checkTurn(text, called = [], { final = true } = {}) {
    const seen = new Set([...this.#calledActions, ...called]);
    if (final) this.#calledActions.clear();
    if (typeof text !== 'string' || text === '' || this.#actions.size === 0) return [];
    const tools = [...this.#actions].map(([n, a]) => ({ name: n, phrases: a.phrases }));
    try {
      return this.#native.claims(text, [...seen].sort(), tools);
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** @internal The MCP adapter's tool check (docs/protocol.md §5.7). */
  _toolCheck(lock, policy, command, url) {
    try {
      return this.#native.toolCheck(lock, policy, command ?? null, url ?? null);
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** @internal Checks a tool list; the names to hide. */
  _checkTools(check, initialize, tools) {
    try {
      return this.#native.checkToolsSync(check, initialize, tools == null ? null : JSON.stringify(tools));
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** @internal Compares an initialize result's serverInfo; whether the session is denied. */
  _serverInfo(check, result) {
    try {
      return this.#native.serverInfoSync(check, JSON.stringify(result));
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** @internal */
  _toolsChanged(check) {
    this.#native.toolsChanged(check);
  }

  /** @internal `null`, or `[reason, message]`. */
  _admitTool(check, name) {
    return this.#native.admitTool(check, name);
  }

  /** @internal declareTools() declares `definition` recorded (the adapters' tools). */
  _recorded(definition) {
    this.#wrapped.set(definition.name, { ...definition });
  }

  /** Wraps every function of `tools` ({name: fn}); returns them under the same names. */
  wrapTools(tools, options = {}) {
    const out = {};
    for (const [name, fn] of Object.entries(tools)) out[name] = this.wrapTool(name, fn, options);
    return out;
  }

  /**
   * Declares the program's full tool list under its source: `tools` are
   * names or MCP-style definitions ({name, description, inputSchema});
   * wrapped tools are declared recorded (and added when missing), others
   * not. Resolves to whether a new declaration was recorded.
   */
  async declareTools(tools = []) {
    if (!Array.isArray(tools)) throw make('invalid', 'declareTools takes an array of tool names or definitions');
    const byName = new Map();
    for (const t of tools) {
      const def = typeof t === 'string' ? { name: t } : t;
      if (def === null || typeof def !== 'object' || typeof def.name !== 'string') {
        throw make('invalid', `a tool to declare is a name or an object with a name, not ${serialiseForMessage(t)}`);
      }
      if (byName.has(def.name)) throw make('invalid', `tool ${JSON.stringify(def.name)} is declared twice`);
      byName.set(def.name, { ...(this.#wrapped.get(def.name) || {}), ...def });
    }
    for (const [name, def] of this.#wrapped) if (!byName.has(name)) byName.set(name, def);
    const declarations = [...byName.values()].map((def) => ({
      name: def.name,
      recorded: this.#wrapped.has(def.name),
      definition: serialise(def, `the definition of ${def.name}`),
    }));
    try {
      return await this.#native.declareTools(declarations);
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** Records a note; resolves to its seq. */
  async note(text) {
    if (typeof text !== 'string') throw make('invalid', `a note is a string, not ${typeof text}`);
    try {
      return await this.#native.note(text);
    } catch (e) {
      throw fromNative(e);
    }
  }

  /**
   * Waits up to `timeout` ms for every record so far to have an accepted
   * receipt; resolves to {complete, records, pending, error}.
   */
  async sync({ timeout = 10_000 } = {}) {
    try {
      return await this.#native.sync(timeoutMs(timeout));
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** The chain's status, as `tally status --json` shows it for the chain. */
  async status() {
    try {
      return JSON.parse(await this.#native.status());
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** Closes this writer: queued records are committed. Safe to call twice. */
  async close() {
    if (this.#closed) return;
    this.#closed = true;
    open.delete(this);
    await this.#native.close();
  }

  /** close(), on the calling thread (for an exit hook). */
  closeSync() {
    if (this.#closed) return;
    this.#closed = true;
    open.delete(this);
    this.#native.closeSync();
  }

  async #decide(tool, args, callId) {
    const json = serialise(args, `the arguments of ${tool}`);
    try {
      return await this.#native.decide(tool, callId ?? null, json);
    } catch (e) {
      throw fromNative(e);
    }
  }

  #decideSync(tool, args, callId) {
    const json = serialise(args, `the arguments of ${tool}`);
    try {
      return this.#native.decideSync(tool, callId ?? null, json);
    } catch (e) {
      throw fromNative(e);
    }
  }

  async #strictWait(call, strict) {
    if (!(strict === undefined ? this.#strict : strict)) return;
    try {
      await this.#native.waitReceipt(call, timeoutMs(this.#strictTimeoutMs));
    } catch (e) {
      this._outcome(call, 'not_run', null, false);
      throw fromNative(e);
    }
  }

  // Runs the decided call; records `ok` with its result or `error` with
  // what it threw, and hands back the result or the error unchanged.
  #run(call, body) {
    let result;
    try {
      result = body();
    } catch (err) {
      this._outcome(call, 'error', safe(errorOutput(err)), false);
      throw err;
    }
    if (isThenable(result)) {
      return Promise.resolve(result).then(
        (value) => {
          this._outcome(call, 'ok', safe(value), false, value);
          return value;
        },
        (err) => {
          this._outcome(call, 'error', safe(errorOutput(err)), false);
          throw err;
        },
      );
    }
    this._outcome(call, 'ok', safe(result), false, result);
    return result;
  }

  /** @internal records an outcome; after the call ran, a failure only warns. */
  _outcome(call, status, json, raise, value) {
    try {
      const action = this.#actions.get(call.tool);
      if (action === undefined) {
        this.#native.outcome(call, status, json);
      } else {
        this.#calledActions.add(call.tool);
        const path = typeof action.proof === 'string' ? action.proof : null;
        const proof = typeof action.proof === 'function' && status === 'ok' ? proofOf(action.proof, value) : null;
        this.#native.actionOutcome(call, status, json, path, proof);
      }
    } catch (e) {
      const err = fromNative(e);
      if (raise) throw err;
      warn(`tally: the outcome of ${call.tool} (call ${call.callId}) ${err.code === 'bad_content' ? 'was recorded without an output hash' : 'was not recorded'}: ${err.message}`);
    }
  }
}

// A wrapped function's recorded arguments: its one argument, or the list
// of them when it takes none or several (README.md "What is recorded").
function argsOf(args) {
  return args.length === 1 ? args[0] : args;
}

// A result that JSON cannot hold is recorded as an outcome without an
// output hash (the core says so, as a warning), not as a failure of the call.
function safe(value) {
  try {
    const json = JSON.stringify(value);
    return json === undefined ? 'null' : json;
  } catch (e) {
    warn(`tally: a result cannot be serialised (${e.message}); its outcome is recorded without an output hash`);
    return null;
  }
}

// A proof function's answer as JSON; one that throws gives no proof (unknown).
function proofOf(fn, value) {
  try {
    const proof = fn(value);
    return proof === undefined || proof === null ? null : JSON.stringify(proof) ?? null;
  } catch {
    return null;
  }
}

function serialiseForMessage(v) {
  try {
    return JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}

function timeoutMs(t) {
  if (typeof t !== 'number' || !Number.isFinite(t) || t < 0) throw make('invalid', `a timeout is a number of milliseconds, not ${serialiseForMessage(t)}`);
  return Math.min(Math.round(t), 0xffffffff);
}

module.exports = {
  Agent,
  CallHandle,
  TallyError,
  AgentNotFound,
  BadContent,
  Invalid,
  NotRecorded,
  NoReceipt,
  Closed,
};
