"""tally: record an agent's own tool calls in its signed, witnessed chain.

The Python skin over tally's Rust core (``tally._native``, which wraps
gateway/src/sdk.rs): canonical JSON, hashing, signing, the chain, the
journal, sync and receipt acceptance are the core's, the same code as the
CLI and the gateway. This module adds the Python idioms: decorators,
context managers, asyncio, exceptions, and handling of ``fork`` and
interpreter exit (sdk/python/README.md).

    import tally
    agent = tally.Agent("claims-bot")

    @agent.tool
    def refund(claim_id: str, amount: int) -> dict: ...
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import functools
import inspect
import json
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, overload

from tally import _native
from tally._native import (
    AgentNotFound,
    BadContent,
    Closed,
    Invalid,
    NoReceipt,
    NotRecorded,
    TallyError,
)

__all__ = [
    "Agent",
    "Proof",
    "AgentNotFound",
    "BadContent",
    "Call",
    "Closed",
    "Invalid",
    "NoReceipt",
    "NotRecorded",
    "SyncResult",
    "TallyError",
]

F = TypeVar("F", bound=Callable[..., Any])

#: How long a strict call waits for its decision's receipt, by default.
STRICT_TIMEOUT = 30.0


def _plain(value: Any) -> Any:
    """What ``json.dumps`` cannot take but a Python program commonly hands
    over: pydantic models and dataclasses become their fields."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__qualname__} is not JSON-serialisable")


def _json(value: Any, what: str) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, default=_plain).encode()
    except (TypeError, ValueError, RecursionError) as e:
        raise BadContent(f"{what} cannot be recorded: {e}") from e


def _error_output(e: BaseException) -> dict[str, str]:
    return {"type": type(e).__qualname__, "message": str(e)}


def _default_source() -> str:
    """``python:<program>``: the source a program's tool list is declared
    under (docs/protocol.md §5.3), stable across runs of one program."""
    main = getattr(sys.modules.get("__main__"), "__file__", None) or (sys.argv[0] if sys.argv else "")
    stem = os.path.splitext(os.path.basename(main))[0] if main else ""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:200] or "python"
    return f"python:{stem}"


_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _definition(name: str, fn: Callable[..., Any] | None) -> dict[str, Any]:
    """An MCP-style tool definition for ``fn``: its docstring, and an input
    schema from its parameters and their annotations where they are plain
    types (docs/protocol.md §6.2 digests it)."""
    definition: dict[str, Any] = {"name": name}
    if fn is None:
        return definition
    doc = inspect.getdoc(fn)
    if doc:
        definition["description"] = doc
    try:
        sig = inspect.signature(fn)
        hints = _hints(fn)
    except (TypeError, ValueError):
        return definition
    properties: dict[str, Any] = {}
    required = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("self", "cls"):
            continue
        hint = hints.get(p.name)
        origin = getattr(hint, "__origin__", hint)  # list[int] -> list
        t = _TYPES.get(origin) if isinstance(origin, type) else None
        properties[p.name] = {"type": t} if t else {}
        if p.default is p.empty:
            required.append(p.name)
    definition["inputSchema"] = {"type": "object", "properties": properties, "required": required}
    return definition


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        import typing

        return typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: no types, still a schema
        return {}


def _arguments(sig: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The call's arguments by parameter name (what the decision hashes)."""
    if sig is None:
        return {"args": list(args), "kwargs": kwargs} if args else dict(kwargs)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        # The call itself is wrong; let the function raise its own error
        # after the decision records what was passed.
        return {"args": list(args), "kwargs": kwargs}
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif name not in ("self", "cls"):
            out[name] = value
    return out


@dataclasses.dataclass(frozen=True)
class SyncResult:
    """How :meth:`Agent.sync` ended."""

    complete: bool
    records: int
    pending: int
    error: str | None


@dataclasses.dataclass
class _Wrapped:
    name: str
    fn: Callable[..., Any]


#: How an action tool's proof is read from its result (docs/protocol.md
#: §5.2): a member name or path of the result (``"message_id"``,
#: ``"$.receipt.ids[0]"``), read by the core, or a function of the result
#: that returns the proof (a string or a number) or ``None``.
Proof = str | Callable[[Any], Any] | None


@dataclasses.dataclass(frozen=True)
class _Action:
    proof: Proof
    phrases: tuple[str, ...]


_agents: weakref.WeakSet[Agent] = weakref.WeakSet()
_agents_lock = threading.Lock()


class Agent:
    """One writer of an agent's chain (docs/architecture.md "Several
    writers, one chain"): beside any gateways and ``tally record`` of the
    same agent.

    Opens the agent the CLI made (``tally agent init``) in ``state_dir``,
    else ``TALLY_STATE_DIR``, else ``./.tally``; raises
    :class:`AgentNotFound`, naming where it looked, when it is not there.
    ``strict``: every call waits for its decision's accepted witness
    receipt before it runs. ``store_content``: keep arguments and results
    in the local store (their salts are always kept). ``proof_in_clear``:
    action tools' proofs go in their outcomes in clear, not salted-hashed
    (docs/protocol.md §5.2).
    """

    def __init__(
        self,
        name: str,
        state_dir: str | os.PathLike[str] | None = None,
        source: str | None = None,
        strict: bool = False,
        store_content: bool = False,
        *,
        strict_timeout: float = STRICT_TIMEOUT,
        proof_in_clear: bool = False,
    ) -> None:
        self._options: dict[str, Any] = {
            "state_dir": os.fspath(state_dir) if state_dir is not None else None,
            "source": source or _default_source(),
            "store_content": store_content,
            "proof_in_clear": proof_in_clear,
        }
        self._actions: dict[str, _Action] = {}
        # Action tools called since the last final text turn (docs/protocol.md
        # §5.6): a final answer that says so after the call is no claim.
        self._called_actions: set[str] = set()
        self.strict = strict
        self.strict_timeout = strict_timeout
        self._lock = threading.Lock()
        self._native: _native.Agent | None = _native.Agent(name, **self._options)
        self._closed = False
        self._wrapped: dict[str, _Wrapped] = {}
        self._declared: list[tuple[str, bool, bytes]] | None = None
        self.name: str = self._native.name
        self.source: str = self._native.source
        with _agents_lock:
            _agents.add(self)

    # -- the native writer, closed around fork and reopened on first use --
    def _writer(self) -> _native.Agent:
        w = self._native
        if w is not None:
            return w
        with self._lock:
            if self._closed:
                raise Closed("the agent is closed")
            if self._native is None:
                w = _native.Agent(self.name, **self._options)
                if self._declared is not None:
                    w.declare_tools(self._declared)
                self._native = w
            return self._native

    def _before_fork(self) -> None:
        # A child inherits the parent's memory but none of its threads. The
        # writer's threads (tokio's, the chain writer's) park on
        # parking_lot's process-wide queues; a child that starts threads of
        # its own would walk queue entries whose threads and stacks are
        # gone. So no writer thread may exist at fork: the writer is closed
        # (its queue committed, the chain handed on) and parent and child
        # each open a new one on first use.
        with self._lock:
            w, self._native = self._native, None
        if w is not None:
            w.close()

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        w, self._native = self._native, None
        if w is not None:
            # Opened by another thread during the fork: its threads are not
            # here, so it is let go of without being touched.
            w.abandon()

    # -- records -----------------------------------------------------------
    def decide(self, tool: str, arguments: Any = None, call_id: str | None = None) -> _native.Call:
        """Records the decision to call ``tool`` with ``arguments`` and
        returns once it is durable in the chain. Raises
        :class:`BadContent`, :class:`Invalid` or :class:`NotRecorded`."""
        data = _json({} if arguments is None else arguments, f"the arguments of tool {tool!r}")
        return self._writer().decide(tool, data, call_id)

    def outcome(self, call: _native.Call, status: str, output: Any = None) -> str | None:
        """Records how ``call`` ended (``ok``, ``error``, ``cancelled``,
        ``not_run``, ...; docs/protocol.md §5.2). For an action tool
        (:meth:`action`) the outcome also carries its state, read from its
        proof, which is returned: ``posted``, ``unknown`` or ``failed``."""
        action = self._actions.get(call.tool)
        try:
            data = None if output is None else _json(output, f"the result of tool {call.tool!r}")
        except BadContent as e:
            self._record_outcome(call, status, None, action, output)
            raise BadContent(f"{e}; the outcome was recorded without an output hash") from e
        return self._record_outcome(call, status, data, action, output)

    def _record_outcome(
        self, call: _native.Call, status: str, data: bytes | None, action: _Action | None, output: Any
    ) -> str | None:
        if action is None:
            self._writer().outcome(call, status, data)
            return None
        with self._lock:
            self._called_actions.add(call.tool)
        if isinstance(action.proof, str):
            return self._writer().action_outcome(call, status, data, proof_path=action.proof)
        proof: bytes | None = None
        if callable(action.proof) and status == "ok":
            try:
                value = action.proof(output)
                proof = None if value is None else json.dumps(value).encode()
            except Exception:  # a proof function that fails gives no proof: unknown
                proof = None
        return self._writer().action_outcome(call, status, data, proof=proof)

    def action(self, name: str, *, proof: Proof = None, phrases: Iterable[str] = ()) -> None:
        """Marks tool ``name`` as an action (docs/protocol.md §5.2): its
        outcomes carry ``posted`` (``proof`` found in the result),
        ``unknown`` (no proof) or ``failed``; and a model turn that claims
        it was done, by its name or one of ``phrases``, with no call to it,
        is recorded as a claim (§5.6). ``@agent.tool(action=True, ...)``
        does this for a decorated function; call it for tools recorded by
        an adapter."""
        if isinstance(proof, str):
            if not proof:
                raise Invalid(f"tool {name!r}: the proof path is empty")
        elif proof is not None and not callable(proof):
            raise Invalid(f"tool {name!r}: proof must be a member name or path, or a function of the result")
        if isinstance(phrases, str):
            phrases = (phrases,)
        self._actions[name] = _Action(proof, tuple(phrases))

    def check_turn(self, text: str | None, called: Iterable[str] = (), *, final: bool = True) -> list[str]:
        """Checks a model turn's text against the action tools (docs/protocol.md
        §5.6): each action tool it claims was done that neither the turn
        (``called``, the names of its tool calls) nor a call recorded by
        this agent since the last final turn called is recorded as a
        ``claim``; returns their names. ``final``: the turn ends the
        exchange (it has no tool calls), so the calls seen so far are
        forgotten after it. The adapters call this for each model turn."""
        with self._lock:
            seen = set(self._called_actions)
            if final:
                self._called_actions.clear()
        if not text or not self._actions:
            return []
        tools = [(n, list(a.phrases)) for n, a in self._actions.items()]
        return [tool for tool, _ in self._writer().claims(text, sorted(seen | set(called)), tools)]

    def wait_receipt(self, call: _native.Call, timeout: float | None = None) -> None:
        """Waits for ``call``'s decision to have an accepted receipt;
        :class:`NoReceipt` says why it has none."""
        self._writer().wait_receipt(call, self.strict_timeout if timeout is None else timeout)

    def _begin(self, tool: str, arguments: Any, strict: bool, call_id: str | None = None) -> _native.Call:
        call = self.decide(tool, arguments, call_id)
        if strict:
            self._strict_wait(call)
        return call

    def _strict_wait(self, call: _native.Call) -> None:
        try:
            self.wait_receipt(call)
        except NoReceipt:
            self._writer().outcome(call, "not_run", None)
            raise

    def _ended(
        self, call: _native.Call, error: BaseException | None, result: Any = None, status: str = "ok"
    ) -> None:
        if error is None:
            try:
                self.outcome(call, status, result)
            except BadContent as e:
                e.result = result  # type: ignore[attr-defined]
                raise
            return
        status = "cancelled" if isinstance(error, asyncio.CancelledError) else "error"
        try:
            self.outcome(call, status, _error_output(error))
        except TallyError as e:
            # The function's own exception goes on unchanged; say what was lost.
            if hasattr(error, "add_note"):
                error.add_note(f"tally: its outcome was not recorded: {e}")

    # -- decorators ----------------------------------------------------------
    @overload
    def tool(self, fn: F, /) -> F: ...
    @overload
    def tool(
        self,
        /,
        *,
        name: str | None = None,
        strict: bool | None = None,
        action: bool = False,
        proof: Proof = None,
        phrases: Iterable[str] = (),
    ) -> Callable[[F], F]: ...
    def tool(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        strict: bool | None = None,
        action: bool = False,
        proof: Proof = None,
        phrases: Iterable[str] = (),
    ) -> Any:
        """Records every call of the decorated function (sync or async): a
        decision before it runs, an outcome (``ok``, or ``error`` with the
        exception re-raised unchanged) after. If the decision cannot be
        recorded the function does not run (:class:`NotRecorded`).
        ``action=True`` marks a side-effecting tool (:meth:`action`):
        ``proof`` reads its receipt from the result
        (``@agent.tool(action=True, proof="message_id")``)."""
        if (proof is not None or phrases) and not action:
            raise Invalid("proof and phrases are for action tools: add action=True")

        def wrap(f: F) -> F:
            tool_name = name or getattr(f, "__name__", None)
            if action and tool_name:
                self.action(tool_name, proof=proof, phrases=phrases)
            return self._wrap(f, tool_name, strict)

        return wrap(fn) if fn is not None else wrap

    def wrap_tools(self, tools: Iterable[F]) -> list[F]:
        """``[agent.tool(f) for f in tools]``."""
        return [self._wrap(f, getattr(f, "__name__", None), None) for f in tools]

    def _wrap(self, fn: F, name: str | None, strict: bool | None) -> F:
        if not callable(fn):
            raise TypeError(f"{fn!r} is not callable")
        if not name:
            raise Invalid(f"{fn!r} has no __name__: give the tool a name (agent.tool(name=...))")
        try:
            sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
        self._wrapped[name] = _Wrapped(name, fn)
        tool_name = name

        def is_strict() -> bool:
            return self.strict if strict is None else strict

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                # The decision append is tens of microseconds: inline. A
                # strict wait is up to a network round trip: off the loop.
                call = self.decide(tool_name, _arguments(sig, args, kwargs))
                if is_strict():
                    await asyncio.to_thread(self._strict_wait, call)
                try:
                    result = await fn(*args, **kwargs)
                except BaseException as e:
                    self._ended(call, e)
                    raise
                self._ended(call, None, result)
                return result

            async_wrapper.__tally_tool__ = tool_name  # type: ignore[attr-defined]
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            call = self._begin(tool_name, _arguments(sig, args, kwargs), is_strict())
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                self._ended(call, e)
                raise
            self._ended(call, None, result)
            return result

        wrapper.__tally_tool__ = tool_name  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    # -- the rest of the API ---------------------------------------------------
    def declare_tools(
        self, tools: Iterable[str | Callable[..., Any] | Mapping[str, Any]], *, recorded: Iterable[str] = ()
    ) -> bool:
        """Declares the program's full tool list (docs/protocol.md §5.3):
        names, wrapped functions, or MCP tool definitions (dicts with a
        ``name``). Tools wrapped by this agent are declared recorded, the
        others not; the verifier's coverage line names both kinds of gap.
        ``recorded`` names more tools this writer records by other means
        (the adapters' tools). Returns whether a declaration was recorded
        (not when the same list was declared recently)."""
        also = set(recorded)
        entries = []
        for t in tools:
            if isinstance(t, Mapping):
                definition = dict(t)
                name = definition.get("name")
                if not isinstance(name, str):
                    raise Invalid(f"tool definition {t!r} has no name")
            elif callable(t):
                name = getattr(t, "__tally_tool__", None) or getattr(t, "__name__", None)
                if not isinstance(name, str):
                    raise Invalid(f"{t!r} has no name")
                wrapped = self._wrapped.get(name)
                definition = _definition(name, wrapped.fn if wrapped else t)
            elif isinstance(t, str):
                name = t
                wrapped = self._wrapped.get(name)
                definition = _definition(name, wrapped.fn if wrapped else None)
            else:
                raise Invalid(f"{t!r} is neither a tool name, a function nor a definition")
            entries.append((name, name in self._wrapped or name in also, _json(definition, f"the definition of tool {name!r}")))
        declared = self._writer().declare_tools(entries)
        self._declared = entries  # declared again by a writer reopened after fork
        return declared

    def call(
        self, tool: str, arguments: Any = None, *, strict: bool | None = None, call_id: str | None = None
    ) -> Call:
        """A recorded call for code that is not a function::

            with agent.call("refund", {"claim": 7}) as call:
                call.outcome(do_refund(7))

        ``async with`` works too (a strict wait then runs off the loop)."""
        return Call(self, tool, arguments, self.strict if strict is None else strict, call_id)

    def note(self, text: str) -> int:
        """Records a note; returns its seq."""
        return self._writer().note(text)

    def sync(self, timeout: float = 30.0) -> SyncResult:
        """Waits up to ``timeout`` seconds for every record so far to have
        an accepted witness receipt. Raises :class:`NoReceipt` (with the
        witness's reason) when they do not."""
        s = SyncResult(**self._writer().sync(timeout))
        if not s.complete:
            e = NoReceipt(f"{s.pending} of {s.records} records have no receipt: {s.error}")
            e.result = s  # type: ignore[attr-defined]
            raise e
        return s

    async def sync_async(self, timeout: float = 30.0) -> SyncResult:
        """:meth:`sync` off the event loop."""
        return await asyncio.to_thread(self.sync, timeout)

    def status(self) -> dict[str, Any]:
        """The chain's status as its owner gives it (owner, writers, store)."""
        result: dict[str, Any] = json.loads(self._writer().status())
        return result

    def close(self) -> None:
        """Closes this writer: queued records are answered first (an owner
        tries a last sync and hands the chain on). Safe to call twice."""
        with self._lock:
            self._closed = True
            w, self._native = self._native, None
        if w is not None:
            w.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"tally.Agent({self.name!r}, source={self.source!r})"


class Call:
    """A call recorded around a block (:meth:`Agent.call`): the decision
    on entry, the outcome on exit: ``ok`` with what :meth:`outcome` was
    given, ``error`` when the block raises (the exception propagates)."""

    def __init__(self, agent: Agent, tool: str, arguments: Any, strict: bool, call_id: str | None = None) -> None:
        self._agent = agent
        self.tool = tool
        self._call_id = call_id
        self._status = "ok"
        self._arguments = arguments
        self._strict = strict
        self._call: _native.Call | None = None
        self._result: Any = None

    @property
    def call_id(self) -> str | None:
        return self._call.call_id if self._call else None

    def outcome(self, result: Any, status: str = "ok") -> None:
        """The result the outcome records when the block ends, and its
        status (``error`` for a result that reports a failure without
        raising, as an MCP ``isError`` result does)."""
        self._result = result
        self._status = status

    def __enter__(self) -> Call:
        self._call = self._agent._begin(self.tool, self._arguments, self._strict, self._call_id)
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if self._call is not None:
            self._agent._ended(self._call, exc, self._result, self._status)

    async def __aenter__(self) -> Call:
        self._call = self._agent.decide(self.tool, self._arguments, self._call_id)
        if self._strict:
            await asyncio.to_thread(self._agent._strict_wait, self._call)
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.__exit__(exc_type, exc, tb)


def _before_fork() -> None:
    for a in list(_agents):
        a._before_fork()


def _after_fork_in_child() -> None:
    global _agents_lock
    _agents_lock = threading.Lock()
    for a in list(_agents):
        a._after_fork_in_child()


def _close_all() -> None:
    # No runtime threads outlive the interpreter: every open agent commits
    # its queue, tries a last sync and stops its threads.
    for a in list(_agents):
        a.close()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
atexit.register(_close_all)

