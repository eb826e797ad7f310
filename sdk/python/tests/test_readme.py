"""The README's examples run as written (sdk/python/README.md "The API",
and the LangChain adapter's, which needs no model), one after the other in
one namespace, in a folder holding a registered, pinned agent."""

from __future__ import annotations

import os
import re
from pathlib import Path

from conftest import AGENT, Witness, chain, decisions

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(section: str) -> list[str]:
    text = README.read_text()
    start = text.index(f"\n{section}\n")
    end = text.find("\n## ", start + 1)
    end = text.find("\n### ", start + 1) if section.startswith("### ") else end
    return re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], re.S)


def test_the_api_examples_run_as_written(tmp_path: Path, witness: Witness, monkeypatch) -> None:
    folder = tmp_path / "program"
    folder.mkdir()
    state = folder / ".tally"
    witness.register(state)
    monkeypatch.chdir(folder)
    monkeypatch.delenv("TALLY_STATE_DIR", raising=False)
    code = blocks("## The API") + blocks("### LangChain and LangGraph (`langchain-core`)")
    assert len(code) == 8, code
    namespace: dict = {"__name__": "readme"}
    for block in code:
        exec(compile(block, str(README), "exec"), namespace)
    # Several agents were opened (some only the wrapped tools still hold):
    # close them all, as interpreter exit would.
    import tally

    tally._close_all()
    tools = {d["tool"] for d in decisions(chain(state))}
    assert {"lookup", "refund", "pay", "send_email"} <= tools, tools
    assert ["send_email"] == [e["record"]["body"]["tool"] for e in chain(state) if e["record"]["kind"] == "claim"]
    assert os.environ.get("TALLY_STATE_DIR") is None
