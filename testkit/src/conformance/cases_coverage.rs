//! Cases of coverage (protocol.md §11 after the table) and of how tool
//! lists are assembled from their parts (§5.3). Coverage is a statement,
//! never a failure: every case here passes its checks, and what it tests
//! is the coverage lines.

use tally_schemas::record::{Body, ToolEntry, ToolList, ToolPartDigests};

use super::base::{case, finish, ORIGIN};
use super::case::{Case, Expected};
use crate::fixture::{self, digest, tool, Fixture};

fn fx() -> Fixture {
    let mut fx = Fixture::new(ORIGIN, "log");
    fx.add_agent("claims-bot", "claims-bot/1");
    fx
}

/// Part `part` of `parts` of list `list_id`.
fn part(list_id: &str, part: u32, parts: u32, tools: Vec<ToolEntry>) -> Body {
    Body::Tools(ToolList {
        list_id: list_id.to_owned(),
        part,
        parts,
        tools,
        source: None,
        lease_ms: None,
    })
}

/// A decision and its outcome for `tool_name`.
fn call(fx: &mut Fixture, call_id: &str, tool_name: &str) {
    fx.call("claims-bot", call_id, tool_name);
}

/// A tool entry with exactly these part digests.
fn entry(name: &str, recorded: bool, digest_label: &str, parts: ToolPartDigests) -> ToolEntry {
    ToolEntry {
        name: name.to_owned(),
        recorded,
        digest: digest(digest_label),
        parts,
    }
}

fn described(label: &str) -> ToolPartDigests {
    ToolPartDigests {
        description: Some(digest(label)),
        ..ToolPartDigests::default()
    }
}

const NO_LIST: &str =
    "claims-bot: no tool list was declared, so the pack cannot show which of the agent's tools are recorded";

#[allow(clippy::too_many_lines)]
pub(super) fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut add = |name: &str,
                   section,
                   rule: &str,
                   description: &str,
                   fx: &mut Fixture,
                   lines: &[&str],
                   records: u64| {
        let inputs = finish(fx);
        out.push(case(
            name,
            section,
            rule,
            description,
            inputs,
            Expected::passing(true, lines, records),
        ));
    };
    let cov = "§11 coverage";
    let lists = "§5.3, §11 coverage";

    {
        let mut f = fx();
        call(&mut f, "1", "lookup_claim");
        add(
            "coverage-no-tool-list",
            cov,
            "With no completed tool list, an agent's one coverage line says so.",
            "claims-bot makes a call but never declares a tool list",
            &mut f,
            &[NO_LIST],
            2,
        );
    }
    {
        let mut f = fx();
        f.log(
            "claims-bot",
            fixture::tools("l", vec![tool("lookup_claim", true, "1")]),
        );
        call(&mut f, "1", "lookup_claim");
        call(&mut f, "2", "refund");
        add(
            "coverage-undeclared-tool-called",
            cov,
            "A decision's tool that is not in the declared list is named as recorded but not declared; the \"all … recorded\" line is then not given.",
            "claims-bot declares lookup_claim and calls lookup_claim and refund",
            &mut f,
            &["claims-bot: 1 recorded tool is not in the declared tool list: refund"],
            5,
        );
    }
    {
        let mut f = fx();
        f.log(
            "claims-bot",
            fixture::tools(
                "l",
                vec![
                    tool("b_tool", false, "1"),
                    tool("A_tool", false, "1"),
                    tool("a_tool", false, "1"),
                    tool("lookup", true, "1"),
                ],
            ),
        );
        call(&mut f, "1", "zeta");
        call(&mut f, "2", "Alpha");
        call(&mut f, "3", "lookup");
        add(
            "coverage-names-in-byte-order",
            cov,
            "Names are listed in ascending byte order of their UTF-8, joined by \", \", with plural counts; the not-recorded line comes before the not-declared line.",
            "three declared tools are not recorded and two undeclared tools are called",
            &mut f,
            &[
                "claims-bot: 3 declared tools are not recorded: A_tool, a_tool, b_tool",
                "claims-bot: 2 recorded tools are not in the declared tool list: Alpha, zeta",
            ],
            7,
        );
    }
    {
        let mut f = fx();
        f.log("claims-bot", fixture::tools("l", Vec::new()));
        add(
            "coverage-empty-tool-list",
            cov,
            "A declared list of no tools is a list: all 0 declared tools are recorded.",
            "claims-bot declares an empty tool list",
            &mut f,
            &["claims-bot: all 0 declared tools are recorded"],
            1,
        );
    }
    {
        let mut f = fx();
        f.log("claims-bot", part("l", 0, 2, vec![tool("a", true, "1")]));
        f.log("claims-bot", part("l", 1, 2, vec![tool("b", true, "1")]));
        add(
            "coverage-two-part-list",
            lists,
            "A list spans parts that share list_id; it is complete when it holds as many distinct part numbers as parts.",
            "a list of two parts, one tool each",
            &mut f,
            &["claims-bot: all 2 declared tools are recorded"],
            2,
        );
    }
    {
        let mut f = fx();
        f.log("claims-bot", part("l", 0, 2, vec![tool("a", true, "1")]));
        add(
            "coverage-incomplete-list",
            lists,
            "A list missing a part is not declared.",
            "only part 0 of a two-part list",
            &mut f,
            &[NO_LIST],
            1,
        );
    }
    {
        let mut f = fx();
        f.log("claims-bot", part("l", 0, 2, vec![tool("a", false, "1")]));
        f.log("claims-bot", part("l", 1, 3, vec![tool("b", true, "1")]));
        f.log("claims-bot", part("l", 0, 3, vec![tool("c", true, "1")]));
        f.log("claims-bot", part("l", 2, 3, vec![tool("d", true, "1")]));
        add(
            "coverage-parts-mismatch-restarts-the-list",
            lists,
            "A record whose parts differs from the list being assembled under its list_id discards the parts gathered so far and starts the list again.",
            "part 0 of 2 (tool a, not recorded), then parts 1, 0 and 2 of 3 (tools b, c, d)",
            &mut f,
            &["claims-bot: all 3 declared tools are recorded"],
            4,
        );
    }
    {
        let mut f = fx();
        f.log("claims-bot", part("l", 0, 2, vec![tool("a", false, "1")]));
        f.log("claims-bot", part("l", 0, 2, vec![tool("b", true, "1")]));
        f.log("claims-bot", part("l", 1, 2, vec![tool("c", true, "1")]));
        add(
            "coverage-part-repeated-last-copy-wins",
            lists,
            "A part number seen again while the list is assembled replaces the earlier copy.",
            "part 0 (tool a, not recorded), part 0 again (tool b), part 1 (tool c)",
            &mut f,
            &["claims-bot: all 2 declared tools are recorded"],
            3,
        );
    }
    {
        let mut f = fx();
        f.log("claims-bot", part("l", 1, 2, vec![tool("x", false, "1")]));
        f.log("claims-bot", part("l", 0, 2, vec![tool("x", true, "1")]));
        add(
            "coverage-name-in-two-parts-lowest-part-wins",
            lists,
            "A tool name in more than one part of a complete list is taken from the part with the lowest part number.",
            "part 1 (tool x, not recorded) arrives before part 0 (tool x, recorded)",
            &mut f,
            &["claims-bot: all 1 declared tool is recorded"],
            2,
        );
    }
    {
        let mut f = fx();
        f.log("claims-bot", part("l", 0, 1, vec![tool("a", true, "1")]));
        f.log("claims-bot", part("l", 0, 2, vec![tool("b", false, "1")]));
        add(
            "coverage-list-id-used-again-starts-a-new-list",
            lists,
            "After a list completes, a later record with the same list_id starts a new list.",
            "list l completes (tool a); then part 0 of 2 of list l again (tool b, not recorded) stays incomplete",
            &mut f,
            &["claims-bot: all 1 declared tool is recorded"],
            2,
        );
    }
    {
        let mut f = fx();
        for n in 1..=9 {
            f.log(
                "claims-bot",
                part(
                    &format!("L{n}"),
                    0,
                    2,
                    vec![tool(&format!("t{n}"), true, "1")],
                ),
            );
        }
        f.log("claims-bot", part("L1", 1, 2, vec![tool("u1", false, "1")]));
        f.log("claims-bot", part("L3", 1, 2, vec![tool("v3", true, "1")]));
        f.log("claims-bot", part("L2", 1, 2, vec![tool("u2", false, "1")]));
        add(
            "coverage-at-most-8-lists-in-progress",
            lists,
            "At most MAX_LISTS_IN_PROGRESS (8) lists are assembled at once per agent: a record that starts a ninth discards the list whose assembly started earliest.",
            "lists L1..L9 each get part 0 of 2 (L9 discards L1); part 1 of L1 starts L1 anew and discards L2; part 1 of L3 completes L3; part 1 of L2 starts L2 anew",
            &mut f,
            &["claims-bot: all 2 declared tools are recorded"],
            12,
        );
    }
    {
        let mut f = fx();
        let both = |d: &str| ToolPartDigests {
            description: Some(digest(d)),
            annotations: Some(digest("annotations")),
            ..ToolPartDigests::default()
        };
        f.log(
            "claims-bot",
            fixture::tools(
                "one",
                vec![
                    entry("a", true, "a/1", described("a/1")),
                    entry("b", true, "b", described("b")),
                    entry("c", true, "c", described("c")),
                    entry("d", true, "d/1", described("d")),
                    entry("f", true, "f/1", described("f")),
                ],
            ),
        );
        f.log(
            "claims-bot",
            fixture::tools(
                "two",
                vec![
                    entry("f", true, "f/2", both("f")),
                    entry("e", true, "e", described("e")),
                    entry("d", true, "d/2", described("d")),
                    entry("b", false, "b", described("b")),
                    entry("a", true, "a/2", described("a/2")),
                ],
            ),
        );
        add(
            "coverage-tool-changes",
            cov,
            "When a list completes after an earlier one, each name of the new list in byte order is added or changed (naming the parts that differ or are present in one only, or definition when only the digest differs); then each name it lost is removed. A change of recorded alone gives no change line.",
            "list two, completed at seq 1, changes a's description, d's digest only, adds annotations to f, adds e, drops c and stops recording b",
            &mut f,
            &[
                "claims-bot: 1 declared tool is not recorded: b",
                "claims-bot: tool a changed at seq 1: description",
                "claims-bot: tool d changed at seq 1: definition",
                "claims-bot: tool e added at seq 1",
                "claims-bot: tool f changed at seq 1: annotations",
                "claims-bot: tool c removed at seq 1",
            ],
            2,
        );
    }
    {
        let mut f = fx();
        let list = |prefix: &str| -> Vec<ToolEntry> {
            (0..48)
                .map(|i| tool(&format!("{prefix}{i:02}"), true, "1"))
                .collect()
        };
        let mut expected: Vec<String> =
            vec!["claims-bot: all 48 declared tools are recorded".into()];
        let mut changes: Vec<String> = Vec::new();
        for seq in 0..12u64 {
            let (new, old) = if seq % 2 == 0 { ("a", "b") } else { ("b", "a") };
            f.log(
                "claims-bot",
                fixture::tools(&format!("list-{seq}"), list(new)),
            );
            if seq > 0 {
                for i in 0..48 {
                    changes.push(format!("claims-bot: tool {new}{i:02} added at seq {seq}"));
                }
                for i in 0..48 {
                    changes.push(format!("claims-bot: tool {old}{i:02} removed at seq {seq}"));
                }
            }
        }
        assert_eq!(changes.len(), 1056);
        expected.extend(changes.into_iter().take(1000));
        expected.push("claims-bot: 56 more tool changes not listed".into());
        let lines: Vec<&str> = expected.iter().map(String::as_str).collect();
        add(
            "coverage-at-most-1000-change-lines",
            cov,
            "At most MAX_CHANGE_LINES (1,000) change lines are kept per agent, the first in pack order; one last line says how many more were found.",
            "twelve lists of 48 tools alternate between two sets of names: 11 changes of 96 lines each",
            &mut f,
            &lines,
            12,
        );
    }
    {
        let mut f = fx();
        let bad = f.make_with_signature(
            "claims-bot",
            fixture::tools("l", vec![tool("lookup_claim", true, "1")]),
            |s| {
                let mut t = *s;
                t[0] ^= 1;
                t
            },
        );
        f.append(bad, None);
        f.tick(1000);
        call(&mut f, "1", "lookup_claim");
        let inputs = finish(&mut f);
        out.push(case(
            "coverage-reads-records-other-checks-fail",
            cov,
            "Coverage reads every record that passes check 1's per-record rules, whatever the other checks say of it.",
            "claims-bot's tool list record has a bad signature (record_signatures fails), and still declares lookup_claim",
            inputs,
            Expected::passing(true, &["claims-bot: all 1 declared tool is recorded"], 3)
                .fail(&["record_signatures"]),
        ));
    }
    out
}
