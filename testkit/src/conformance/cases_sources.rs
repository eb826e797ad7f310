//! Cases of tool lists per source (protocol.md §5.3 `source` and
//! `lease_ms`, §11 coverage): the declared tools are the union of the live
//! sources' latest lists. The passing cases test the coverage lines; the
//! failing ones are tools records whose `source` or `lease_ms` breaks §5.3,
//! refused by check 1.

use serde_json::{json, Value};
use tally_schemas::record::{Body, ToolEntry, ToolList};

use super::base::{case, finish, Base, BASE_COVERAGE, BASE_RECORDS, ORIGIN};
use super::case::{Case, Expected};
use crate::fixture::{tool, Fixture};

fn fx() -> Fixture {
    let mut fx = Fixture::new(ORIGIN, "log");
    fx.add_agent("claims-bot", "claims-bot/1");
    fx
}

/// Part `part` of `parts` of list `list_id`, declared by `source`.
fn part(
    list_id: &str,
    part: u32,
    parts: u32,
    source: &str,
    lease_ms: Option<u64>,
    tools: Vec<ToolEntry>,
) -> Body {
    Body::Tools(ToolList {
        list_id: list_id.to_owned(),
        part,
        parts,
        tools,
        source: Some(source.to_owned()),
        lease_ms,
    })
}

/// A one-part list of `source`.
fn named(list_id: &str, source: &str, lease_ms: Option<u64>, tools: Vec<ToolEntry>) -> Body {
    part(list_id, 0, 1, source, lease_ms, tools)
}

#[allow(clippy::too_many_lines)]
pub(super) fn cases(b: &Base) -> Vec<Case> {
    let mut out = Vec::new();
    let mut add = |name: &str,
                   rule: &str,
                   description: &str,
                   fx: &mut Fixture,
                   lines: &[&str],
                   records: u64| {
        let inputs = finish(fx);
        out.push(case(
            name,
            "§5.3, §11 coverage",
            rule,
            description,
            inputs,
            Expected::passing(true, lines, records),
        ));
    };

    {
        let mut f = fx();
        f.log(
            "claims-bot",
            named(
                "l1",
                "crm",
                None,
                vec![tool("lookup_claim", true, "v1"), tool("refund", true, "v1")],
            ),
        );
        f.log(
            "claims-bot",
            named(
                "l2",
                "mailer",
                Some(3_600_000),
                vec![tool("send_notification", false, "v1")],
            ),
        );
        f.call("claims-bot", "1", "lookup_claim");
        f.call("claims-bot", "2", "send_notification");
        add(
            "coverage-sources-union",
            "The declared tools are the union of the latest lists of the live named sources; one line per named source, in byte order of its name, says how many tools it declared and at which seq.",
            "source crm declares lookup_claim and refund, source mailer (lease 1 h) declares send_notification, not recorded; lookup_claim and send_notification are called",
            &mut f,
            &[
                "claims-bot: 1 declared tool is not recorded: send_notification",
                "claims-bot: tool source crm: 2 tools, declared at seq 0",
                "claims-bot: tool source mailer: 1 tool, declared at seq 1",
            ],
            6,
        );
    }
    {
        let mut f = fx();
        f.log(
            "claims-bot",
            named(
                "l1",
                "crm",
                Some(60_000),
                vec![
                    tool("lookup_claim", true, "v1"),
                    tool("refund", false, "v1"),
                ],
            ),
        );
        f.log(
            "claims-bot",
            named("l2", "mailer", None, vec![tool("send_mail", true, "v1")]),
        );
        f.call("claims-bot", "1", "lookup_claim");
        f.tick(120_000);
        f.call("claims-bot", "2", "send_mail");
        add(
            "coverage-source-dropped-out",
            "A named source's list holds until its completing record's time plus its lease; past it the source drops out: its tools are not declared at the agent's last record, and a decision that called one of them while it was live is not counted as undeclared.",
            "source crm (lease 60 s) declares lookup_claim and refund (not recorded), source mailer declares send_mail; lookup_claim is called 2 s after crm's list, send_mail 124 s after it",
            &mut f,
            &[
                "claims-bot: all 1 declared tool is recorded",
                "claims-bot: tool source crm dropped out: declared at seq 0, its lease of 60000 ms ended before the agent's last record",
                "claims-bot: tool source mailer: 1 tool, declared at seq 1",
            ],
            6,
        );
    }
    {
        let mut f = fx();
        f.log(
            "claims-bot",
            named(
                "l1",
                "crm",
                Some(60_000),
                vec![tool("lookup_claim", true, "v1")],
            ),
        );
        f.tick(120_000);
        f.call("claims-bot", "1", "lookup_claim");
        add(
            "coverage-source-dropped-out-before-the-call",
            "A decision whose tool was in no live list when it was made is counted as undeclared; with every named source dropped out the declared list is empty, and the summary line is still given.",
            "source crm (lease 60 s) declares lookup_claim, which is called 121 s later",
            &mut f,
            &[
                "claims-bot: 1 recorded tool is not in the declared tool list: lookup_claim",
                "claims-bot: tool source crm dropped out: declared at seq 0, its lease of 60000 ms ended before the agent's last record",
            ],
            3,
        );
    }
    {
        let mut f = fx();
        f.log(
            "claims-bot",
            named("l1", "crm", None, vec![tool("search", true, "v1")]),
        );
        f.log(
            "claims-bot",
            named("l2", "docs", None, vec![tool("search", false, "v2")]),
        );
        f.call("claims-bot", "1", "search");
        add(
            "coverage-name-in-two-sources-later-list-wins",
            "When two lists of the union name the same tool, the entry of the list completed later in pack order is taken.",
            "source crm declares search as recorded, then source docs declares search as not recorded",
            &mut f,
            &[
                "claims-bot: 1 declared tool is not recorded: search",
                "claims-bot: tool source crm: 1 tool, declared at seq 0",
                "claims-bot: tool source docs: 1 tool, declared at seq 1",
            ],
            4,
        );
    }
    {
        let mut f = fx();
        f.log(
            "claims-bot",
            crate::fixture::tools("l0", vec![tool("archive", true, "v1")]),
        );
        f.log(
            "claims-bot",
            named("l1", "crm", None, vec![tool("lookup_claim", true, "v1")]),
        );
        f.log(
            "claims-bot",
            named("l2", "mailer", None, vec![tool("send_mail", true, "v1")]),
        );
        f.log(
            "claims-bot",
            named(
                "l3",
                "crm",
                None,
                vec![tool("lookup_claim", true, "v2"), tool("refund", true, "v1")],
            ),
        );
        f.log("claims-bot", named("l4", "mailer", None, Vec::new()));
        add(
            "coverage-change-lines-per-source",
            "A newly completed list is compared with the previous completed list of the same source (the unnamed source is one source); source lines come after the summary lines and before the change lines.",
            "an unnamed list declares archive; crm declares lookup_claim, mailer send_mail; crm then changes lookup_claim's description and adds refund, and mailer declares no tools",
            &mut f,
            &[
                "claims-bot: all 3 declared tools are recorded",
                "claims-bot: tool source crm: 2 tools, declared at seq 3",
                "claims-bot: tool source mailer: 0 tools, declared at seq 4",
                "claims-bot: tool lookup_claim changed at seq 3: description",
                "claims-bot: tool refund added at seq 3",
                "claims-bot: tool send_mail removed at seq 4",
            ],
            5,
        );
    }
    {
        let mut f = fx();
        let list = || vec![tool("lookup_claim", true, "v1")];
        f.log("claims-bot", named("l1", "crm", Some(60_000), list()));
        f.tick(50_000);
        f.log("claims-bot", named("l2", "crm", Some(60_000), list()));
        f.tick(50_000);
        f.call("claims-bot", "1", "lookup_claim");
        add(
            "coverage-source-redeclared-renews-its-lease",
            "A source's latest list is the one that counts: a source that declares again before its lease ends stays live for the new list's lease.",
            "source crm (lease 60 s) declares lookup_claim, again 51 s later, and lookup_claim is called 102 s after the first list",
            &mut f,
            &[
                "claims-bot: all 1 declared tool is recorded",
                "claims-bot: tool source crm: 1 tool, declared at seq 1",
            ],
            4,
        );
    }
    {
        let mut f = fx();
        f.log(
            "claims-bot",
            part("l", 0, 2, "crm", None, vec![tool("a", true, "v1")]),
        );
        f.log(
            "claims-bot",
            part("l", 1, 2, "mailer", None, vec![tool("b", true, "v1")]),
        );
        f.log(
            "claims-bot",
            part("l", 0, 2, "mailer", None, vec![tool("c", true, "v1")]),
        );
        add(
            "coverage-source-mismatch-restarts-the-list",
            "A part whose source or lease_ms differs from the list being assembled under the same list_id starts the list again, as a differing parts does.",
            "part 0 of 2 of list l from crm (tool a), then parts 1 and 0 of list l from mailer (tools b, c)",
            &mut f,
            &[
                "claims-bot: all 2 declared tools are recorded",
                "claims-bot: tool source mailer: 2 tools, declared at seq 2",
            ],
            3,
        );
    }

    // --- records §5.3 refuses: check 1 --------------------------------------
    // claims-bot#6 is its second tool list; refused, the first one stays
    // declared and the chain has a gap there.
    let refused = |name: &str, rule: &str, description: &str, edit: &dyn Fn(&mut Value)| {
        let mut l = b.lines();
        let i = l.find("claims-bot", 6);
        l.edit(i, |v| edit(&mut v["record"]["body"]));
        case(
            name,
            "§3, §5.3, §11 check 1",
            rule,
            description,
            b.inputs(l.join()),
            b.passing()
                .fail(&["schema", "chain"])
                .records(BASE_RECORDS - 1)
                .coverage(&[BASE_COVERAGE[0], BASE_COVERAGE[2]]),
        )
    };
    out.push(refused(
        "tools-lease-without-source",
        "lease_ms is allowed only together with source: a record with lease_ms and no source fails check 1.",
        "claims-bot#6, its second tool list, gains \"lease_ms\": 60000 and no source",
        &|body| body["lease_ms"] = json!(60_000),
    ));
    out.push(refused(
        "tools-lease-below-its-range",
        "lease_ms is an integer from 1,000 to 86,400,000: 999 fails check 1.",
        "claims-bot#6 gains \"source\": \"crm\" and \"lease_ms\": 999",
        &|body| {
            body["source"] = json!("crm");
            body["lease_ms"] = json!(999);
        },
    ));
    out.push(refused(
        "tools-lease-above-its-range",
        "lease_ms is an integer from 1,000 to 86,400,000: 86,400,001 fails check 1.",
        "claims-bot#6 gains \"source\": \"crm\" and \"lease_ms\": 86400001",
        &|body| {
            body["source"] = json!("crm");
            body["lease_ms"] = json!(86_400_001);
        },
    ));
    out.push(refused(
        "tools-source-null",
        "An optional member is omitted when it has no value: \"source\": null fails check 1.",
        "claims-bot#6 gains \"source\": null",
        &|body| body["source"] = Value::Null,
    ));
    out.push(refused(
        "tools-source-control-character",
        "source is text: 1–256 bytes of UTF-8 with no control character; one with U+0007 fails check 1.",
        "claims-bot#6 gains \"source\": \"crm\\u0007\"",
        &|body| body["source"] = json!("crm\u{7}"),
    ));
    out.push(refused(
        "tools-source-empty",
        "source is text: 1–256 bytes of UTF-8; the empty string fails check 1.",
        "claims-bot#6 gains \"source\": \"\"",
        &|body| body["source"] = json!(""),
    ));
    out
}
