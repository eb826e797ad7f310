"""Action tools and claims (docs/protocol.md §5.2 "Action outcomes", §5.6):
an action's outcome resolves from its own receipt (posted / unknown /
failed), and a model turn that claims an action with no call to it is
recorded, through the decorator and each adapter that sees model turns,
with the real frameworks and scripted models; then `tally verify` states
it against the real `tally serve`."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

import tally
from conftest import AGENT, Witness, chain, check_links, outcomes

SENT = "I've sent the email to the customer."


def actions(state: Path) -> list[tuple[str, str | None, bool, str | None]]:
    """(status, state, has proof_hash, proof) of each outcome."""
    entries = chain(state)
    check_links(entries)
    return [(o["status"], o.get("state"), "proof_hash" in o, o.get("proof")) for o in outcomes(entries)]


def claims(state: Path) -> list[tuple[int, str]]:
    """(seq, tool) of each claim record."""
    out = []
    for e in chain(state):
        r = e["record"]
        if r["kind"] == "claim":
            assert set(r["body"]) == {"tool", "turn_hash"}  # the text is not in the record
            out.append((r["seq"], r["body"]["tool"]))
    return out


def test_decorated_actions_resolve_posted_unknown_failed(local_agent: Path) -> None:
    agent = tally.Agent(AGENT, state_dir=local_agent)

    @agent.tool(action=True, proof="message_id")
    def send_email(to: str, fail: bool = False, silent: bool = False) -> dict:
        """Sends an email."""
        if fail:
            raise ConnectionError("smtp refused")
        return {"queued": True} if silent else {"message_id": f"m-{to}"}

    @agent.tool(action=True, proof=lambda r: r["charge"]["id"] if r.get("charge") else None)
    async def charge(amount: int) -> dict:
        return {"charge": {"id": 9001}} if amount else {}

    @agent.tool(action=True, proof="$.receipt.ids[0]")
    def write_row(n: int) -> dict:
        return {"receipt": {"ids": [f"row-{n}"]}}

    @agent.tool
    def lookup(claim: int) -> str:
        return "open"

    send_email("ann")
    send_email("bob", silent=True)
    with pytest.raises(ConnectionError):
        send_email("cy", fail=True)
    asyncio.run(charge(5))
    asyncio.run(charge(0))
    write_row(3)
    lookup(1)
    with agent.call("send_email", {"to": "dee"}) as call:
        call.outcome({"message_id": "m-dee"})
    with agent.call("send_email", {"to": "eve"}) as call:
        call.outcome({"message_id": "m-eve"}, status="error")  # an isError result
    agent.close()
    assert actions(local_agent) == [
        ("ok", "posted", True, None),
        ("ok", "unknown", False, None),
        ("error", "failed", False, None),
        ("ok", "posted", True, None),
        ("ok", "unknown", False, None),
        ("ok", "posted", True, None),
        ("ok", None, False, None),  # not an action
        ("ok", "posted", True, None),
        ("error", "failed", False, None),
    ]


def test_proofs_in_clear_and_bad_options(local_agent: Path) -> None:
    agent = tally.Agent(AGENT, state_dir=local_agent, proof_in_clear=True)

    @agent.tool(action=True, proof="id")
    def post(n: int) -> dict:
        return {"id": n} if n else {"id": ""}

    assert post(42) == {"id": 42}
    post(0)  # an empty proof is no proof
    with pytest.raises(tally.Invalid):
        agent.tool(proof="id")(lambda: None)  # proof without action=True
    with pytest.raises(tally.Invalid):
        agent.action("x", proof=3)  # type: ignore[arg-type]
    agent.action("bad_path", proof="a[")
    with pytest.raises(tally.Invalid, match="unclosed"):
        with agent.call("bad_path", {}) as call:
            call.outcome({})
    agent.close()
    assert actions(local_agent)[:2] == [("ok", "posted", False, "42"), ("ok", "unknown", False, None)]


def test_openai_chat_loop_catches_a_claim_and_not_a_call(local_agent: Path) -> None:
    from openai.types.chat import ChatCompletion

    from tally.adapters.openai import tool_messages

    agent = tally.Agent(AGENT, state_dir=local_agent)

    @agent.tool(action=True, proof="message_id")
    def send_email(to: str) -> dict:
        """Sends an email."""
        return {"message_id": "m-1"}

    def completion(content: str | None, calls: list[tuple[str, str, str]] = ()) -> ChatCompletion:
        message: dict = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls
            ]
        return ChatCompletion.model_validate({
            "id": "cc", "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "finish_reason": "tool_calls" if calls else "stop", "message": message}],
        })

    # A text-only turn that claims the email went out: caught.
    assert tool_messages(agent, completion(SENT), [send_email]) == []
    # A turn that calls the tool and says so, then the final answer: not caught.
    sent = tool_messages(agent, completion("Sending the email now.", [("call_1", "send_email", '{"to": "ann"}')]), [send_email])
    assert sent == [{"role": "tool", "tool_call_id": "call_1", "content": '{"message_id": "m-1"}'}]
    assert tool_messages(agent, completion(SENT), [send_email]) == []
    # The exchange ended: the next bare claim is caught again.
    assert tool_messages(agent, completion("Done - the email was sent."), [send_email]) == []
    agent.close()
    assert [t for _, t in claims(local_agent)] == ["send_email", "send_email"]
    assert actions(local_agent) == [("ok", "posted", True, None)]


def test_anthropic_loop_with_declared_phrases(local_agent: Path) -> None:
    from anthropic.types import Message

    from tally.adapters.anthropic import tool_results

    agent = tally.Agent(AGENT, state_dir=local_agent)

    @agent.tool(action=True, proof="charge_id", phrases=["payment went through"])
    def charge_card(amount: int) -> dict:
        return {"charge_id": "ch_1"}

    def message(*blocks: dict) -> Message:
        return Message.model_validate({
            "id": "msg", "type": "message", "role": "assistant", "model": "scripted",
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}, "content": list(blocks),
        })

    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    assert tool_results(agent, message(text("Good news: your payment went through!")), [charge_card]) == {
        "role": "user", "content": []
    }
    reply = tool_results(
        agent,
        message(text("Charging now."), {"type": "tool_use", "id": "toolu_1", "name": "charge_card", "input": {"amount": 5}}),
        [charge_card],
    )
    assert reply["content"][0]["is_error"] is False
    tool_results(agent, message(text("I charged your card; the payment went through.")), [charge_card])
    tool_results(agent, message(text("I have not charged your card yet.")), [charge_card])
    agent.close()
    assert [t for _, t in claims(local_agent)] == ["charge_card"]


def test_openai_agents_run_hooks(local_agent: Path) -> None:
    from agents import Agent as OpenAIAgent
    from agents import ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
    from agents.models.interface import Model
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from tally.adapters.openai_agents import ClaimHooks, record_tools

    set_tracing_disabled(True)

    @function_tool
    def send_email(to: str) -> dict:
        """Sends an email."""
        return {"message_id": f"m-{to}"}

    def say(text: str) -> list:
        return [ResponseOutputMessage(
            id="m", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )]

    class Scripted(Model):
        """Run 1 calls send_email then says so; run 2 only says so."""

        def __init__(self) -> None:
            self.turns = [
                [ResponseFunctionToolCall(type="function_call", call_id="fc_1", name="send_email", arguments='{"to": "ann"}')],
                say(SENT),
                say(SENT),
            ]

        async def get_response(self, *args, **kwargs) -> ModelResponse:  # type: ignore[override]
            return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

        def stream_response(self, *args, **kwargs):  # type: ignore[override]
            raise NotImplementedError("the test runs without streaming")

    agent = tally.Agent(AGENT, state_dir=local_agent)
    agent.action("send_email", proof="message_id")
    bot = OpenAIAgent(name="mailer", instructions="help", tools=record_tools(agent, [send_email]), model=Scripted())
    hooks = ClaimHooks(agent)
    assert Runner.run_sync(bot, "email ann", hooks=hooks).final_output == SENT
    assert Runner.run_sync(bot, "email bob", hooks=hooks).final_output == SENT
    agent.close()
    assert [t for _, t in claims(local_agent)] == ["send_email"]
    assert actions(local_agent) == [("ok", "posted", True, None)]


def test_langchain_claim_callback(local_agent: Path) -> None:
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool

    from tally.adapters.langchain import ClaimCallback, record_tools

    @tool
    def send_email(to: str) -> dict:
        """Sends an email."""
        return {"message_id": f"m-{to}"}

    model = FakeMessagesListChatModel(
        responses=[
            AIMessage(content="Sending.", tool_calls=[{"name": "send_email", "args": {"to": "ann"}, "id": "call_1"}]),
            AIMessage(content=SENT),
            AIMessage(content=[{"type": "text", "text": SENT}]),
        ]
    )
    agent = tally.Agent(AGENT, state_dir=local_agent)
    agent.action("send_email", proof="message_id")
    [send] = record_tools(agent, [send_email])
    config = {"callbacks": [ClaimCallback(agent)]}

    async def run() -> None:
        ai = await model.ainvoke([HumanMessage("email ann")], config=config)
        for tc in ai.tool_calls:
            await send.ainvoke(tc)
        await model.ainvoke([HumanMessage("ok?")], config=config)  # says so after the call: no claim
        await model.ainvoke([HumanMessage("email bob")], config=config)  # says so with no call: a claim

    asyncio.run(run())
    agent.close()
    assert [t for _, t in claims(local_agent)] == ["send_email"]
    assert actions(local_agent) == [("ok", "posted", True, None)]


def test_the_pack_verifies_and_states_the_actions_and_the_claim(state: Path, tmp_path: Path, witness: Witness) -> None:
    vkey = witness.register(state)
    agent = tally.Agent(AGENT, state_dir=state, store_content=True)

    @agent.tool(action=True, proof="message_id")
    def send_email(to: str) -> dict:
        """Sends an email."""
        if to == "nobody":
            raise ValueError("no such address")
        return {"message_id": "m-1"} if to == "ann" else {}

    agent.declare_tools([send_email])
    send_email("ann")
    send_email("bob")
    with pytest.raises(ValueError):
        send_email("nobody")
    assert agent.check_turn(SENT) == []  # after calls of send_email in this exchange
    assert agent.check_turn(SENT) == ["send_email"]
    agent.sync(60)
    agent.close()
    [(seq, _)] = claims(state)
    # The turn's text is kept (store_content) with its salt in the local
    # store, so the claim can be disclosed: SHA-256(salt || JCS(text)).
    [claim] = [e for e in chain(state) if e["record"]["kind"] == "claim"]
    assert claim["secret"]["content"] == SENT
    salted = bytes.fromhex(claim["secret"]["salt"]) + json.dumps(SENT).encode()
    assert hashlib.sha256(salted).hexdigest() == claim["record"]["body"]["turn_hash"]
    out = witness.verify(state, tmp_path, vkey)
    assert f"coverage: {AGENT}: action calls: 1 posted, 1 unknown, 1 failed\n" in out
    assert f"coverage: {AGENT}: 1 claim without a call: send_email at seq {seq}\n" in out
    assert "PASS" in out
