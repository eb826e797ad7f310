//! What the audit report (docs/protocol.md §11.3) says per agent beyond the
//! checks, gathered while the checks run, from the records that passed
//! check 1's per-record rules: calls per tool over time, outcome statuses,
//! decisions left without an outcome, key rotations; and the disclosures
//! (§6.3) checked against their records. Memory per agent is bounded: at
//! most [`MAX_BUCKETS`] time buckets (they widen as the agent's records
//! spread), the tool names it called, the listed calls, and the decisions
//! still open at the point read.

use std::collections::{BTreeMap, HashMap};

use tally_schemas::audit::{
    AgentSection, CallRef, Chart, KeyChange, StatusCount, ToolSeries, MAX_BUCKETS, MAX_LISTED,
    MAX_TOOL_SERIES,
};
use tally_schemas::disclosure::Disclosure;
use tally_schemas::record::{Body, OutcomeStatus};
use tally_schemas::report::{DisclosureCheck, DisclosureStatus};
use tally_schemas::{Hash, Record, UnixMillis};

/// Tool names kept per agent; calls of further tools are counted as other.
const MAX_TOOLS: usize = 4096;

/// Decisions without an outcome tracked per agent, at most.
const MAX_OPEN: usize = 1 << 20;

/// A tool's calls, and its calls per bucket.
type Series = (u64, BTreeMap<i64, u64>);

/// The period: records made at or after `from` and before `to`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Period {
    /// Start, inclusive.
    pub from: Option<UnixMillis>,
    /// End, exclusive.
    pub to: Option<UnixMillis>,
}

impl Period {
    fn holds(&self, t: UnixMillis) -> bool {
        self.from.is_none_or(|f| t >= f) && self.to.is_none_or(|e| t < e)
    }
}

/// What `audit` gathers besides the checks.
#[derive(Debug, Default)]
pub struct AuditOptions {
    /// The period of the per-agent figures.
    pub period: Period,
    /// The disclosures to check, each with the file it came from.
    pub disclosures: Vec<(String, Disclosure)>,
}

fn rfc3339(t: UnixMillis) -> String {
    t.to_rfc3339().unwrap_or_else(|_| t.as_millis().to_string())
}

#[derive(Debug)]
struct Open {
    seq: u64,
    time: UnixMillis,
    tool: String,
    in_period: bool,
}

/// One agent's figures.
#[derive(Debug)]
struct AgentActivity {
    period_records: u64,
    first: Option<UnixMillis>,
    last: Option<UnixMillis>,
    calls: u64,
    bucket_ms: u64,
    /// Records per bucket (bucket = time / bucket_ms).
    records: BTreeMap<i64, u64>,
    /// Per tool: calls, and calls per bucket.
    tools: HashMap<String, Series>,
    other: Series,
    statuses: BTreeMap<&'static str, u64>,
    not_ok: Vec<CallRef>,
    not_ok_more: u64,
    open: HashMap<String, Open>,
    key_changes: Vec<KeyChange>,
}

impl Default for AgentActivity {
    fn default() -> Self {
        Self {
            period_records: 0,
            first: None,
            last: None,
            calls: 0,
            bucket_ms: 1000,
            records: BTreeMap::new(),
            tools: HashMap::new(),
            other: (0, BTreeMap::new()),
            statuses: BTreeMap::new(),
            not_ok: Vec::new(),
            not_ok_more: 0,
            open: HashMap::new(),
            key_changes: Vec::new(),
        }
    }
}

fn rebucket(m: &mut BTreeMap<i64, u64>) {
    let old = std::mem::take(m);
    for (k, v) in old {
        *m.entry(k.div_euclid(2)).or_default() += v;
    }
}

impl AgentActivity {
    fn bucket(&mut self, t: UnixMillis) -> i64 {
        let width = |ms: u64| i64::try_from(ms).unwrap_or(i64::MAX);
        let mut b = t.as_millis().div_euclid(width(self.bucket_ms));
        // Widen until the agent's span fits in MAX_BUCKETS buckets.
        loop {
            let lo = self.records.keys().next().copied().unwrap_or(b).min(b);
            let hi = self.records.keys().next_back().copied().unwrap_or(b).max(b);
            if usize::try_from(hi - lo).unwrap_or(usize::MAX) < MAX_BUCKETS {
                return b;
            }
            self.bucket_ms = self.bucket_ms.saturating_mul(2);
            rebucket(&mut self.records);
            for (_, m) in self.tools.values_mut() {
                rebucket(m);
            }
            rebucket(&mut self.other.1);
            b = t.as_millis().div_euclid(width(self.bucket_ms));
        }
    }

    fn record(&mut self, r: &Record, period: &Period) {
        let in_period = period.holds(r.time);
        match &r.body {
            // Open decisions are bounded like the outcomes check's
            // (a pack with more is failing that check anyway).
            Body::Decision(d) if self.open.len() < MAX_OPEN => {
                self.open.insert(
                    d.call_id.clone(),
                    Open {
                        seq: r.seq.get(),
                        time: r.time,
                        tool: d.tool.clone(),
                        in_period,
                    },
                );
            }
            Body::Outcome(o) => {
                let open = self.open.remove(&o.call_id);
                if in_period {
                    *self.statuses.entry(o.status.as_str()).or_default() += 1;
                    if o.status != OutcomeStatus::Ok {
                        if self.not_ok.len() < MAX_LISTED {
                            self.not_ok.push(CallRef {
                                seq: r.seq.get(),
                                time: rfc3339(r.time),
                                call_id: o.call_id.clone(),
                                tool: open.map(|x| x.tool),
                                status: o.status.as_str().to_owned(),
                            });
                        } else {
                            self.not_ok_more += 1;
                        }
                    }
                }
            }
            Body::KeyRotation(k) if in_period => self.key_changes.push(KeyChange {
                seq: r.seq.get(),
                time: rfc3339(r.time),
                new_key_id: k.new_key_id.to_hex(),
            }),
            _ => {}
        }
        if !in_period {
            return;
        }
        self.period_records += 1;
        self.first = Some(self.first.map_or(r.time, |f| f.min(r.time)));
        self.last = Some(self.last.map_or(r.time, |l| l.max(r.time)));
        let b = self.bucket(r.time);
        *self.records.entry(b).or_default() += 1;
        if let Body::Decision(d) = &r.body {
            self.calls += 1;
            let series = if let Some(s) = self.tools.get_mut(&d.tool) {
                s
            } else if self.tools.len() < MAX_TOOLS {
                self.tools.entry(d.tool.clone()).or_default()
            } else {
                &mut self.other
            };
            series.0 += 1;
            *series.1.entry(b).or_default() += 1;
        }
    }

    fn chart(&self) -> Option<Chart> {
        let lo = *self.records.keys().next()?;
        let hi = *self.records.keys().next_back()?;
        let n = usize::try_from(hi - lo + 1).unwrap_or(MAX_BUCKETS);
        let dense = |m: &BTreeMap<i64, u64>| {
            let mut v = vec![0u64; n];
            for (k, c) in m {
                if let Some(slot) = usize::try_from(k - lo).ok().and_then(|i| v.get_mut(i)) {
                    *slot += c;
                }
            }
            v
        };
        let mut tools: Vec<(&String, &Series)> = self.tools.iter().collect();
        tools.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(b.0)));
        let mut series: Vec<ToolSeries> = tools
            .iter()
            .take(MAX_TOOL_SERIES)
            .map(|(name, (calls, m))| ToolSeries {
                tool: Some((*name).clone()),
                calls: *calls,
                counts: dense(m),
            })
            .collect();
        let mut rest = self.other.1.clone();
        let mut rest_calls = self.other.0;
        for (_, (calls, m)) in tools.iter().skip(MAX_TOOL_SERIES) {
            rest_calls += calls;
            for (k, c) in m {
                *rest.entry(*k).or_default() += c;
            }
        }
        if rest_calls > 0 {
            series.push(ToolSeries {
                tool: None,
                calls: rest_calls,
                counts: dense(&rest),
            });
        }
        let width = i64::try_from(self.bucket_ms).unwrap_or(i64::MAX);
        Some(Chart {
            start_ms: lo.saturating_mul(width),
            bucket_ms: self.bucket_ms,
            buckets: n as u64,
            records: dense(&self.records),
            tools: series,
        })
    }
}

/// A disclosure being checked.
#[derive(Debug)]
struct Pending {
    file: String,
    d: Disclosure,
    /// Per part (input, output): `None` not seen yet; `Some(Ok(()))`
    /// matched; `Some(Err(why))`.
    input: Option<Result<(), String>>,
    output: Option<Result<(), String>>,
}

/// The per-agent figures and the disclosures, fed by the driver.
#[derive(Debug)]
pub(crate) struct Activity {
    period: Period,
    agents: Vec<AgentActivity>,
    disclosures: Vec<Pending>,
    /// (agent, seq) → (disclosure, is_output).
    wanted: HashMap<(String, u64), Vec<(usize, bool)>>,
}

impl Activity {
    pub(crate) fn new(n: usize, options: AuditOptions) -> Self {
        let mut wanted: HashMap<(String, u64), Vec<(usize, bool)>> = HashMap::new();
        let disclosures: Vec<Pending> = options
            .disclosures
            .into_iter()
            .enumerate()
            .map(|(i, (file, d))| {
                if let Some(p) = &d.input {
                    wanted
                        .entry((d.agent.clone(), p.seq))
                        .or_default()
                        .push((i, false));
                }
                if let Some(p) = &d.output {
                    wanted
                        .entry((d.agent.clone(), p.seq))
                        .or_default()
                        .push((i, true));
                }
                Pending {
                    file,
                    d,
                    input: None,
                    output: None,
                }
            })
            .collect();
        Self {
            period: options.period,
            agents: (0..n).map(|_| AgentActivity::default()).collect(),
            disclosures,
            wanted,
        }
    }

    /// A record of header agent `agent` that passed check 1's per-record
    /// rules.
    pub(crate) fn record(&mut self, agent: usize, r: &Record) {
        if let Some(a) = self.agents.get_mut(agent) {
            a.record(r, &self.period);
        }
        if self.wanted.is_empty() {
            return;
        }
        let Some(list) = self.wanted.get(&(r.agent.as_str().to_owned(), r.seq.get())) else {
            return;
        };
        for &(i, is_output) in list {
            let p = &mut self.disclosures[i];
            let verdict = judge(&p.d, is_output, r);
            if is_output {
                p.output = Some(verdict);
            } else {
                p.input = Some(verdict);
            }
        }
    }

    /// The per-agent sections (without statements and named records, which
    /// come from the report) and the disclosure checks.
    pub(crate) fn finish(
        self,
        agents: &[(String, u64, u64, u64)],
    ) -> (Vec<AgentSection>, Vec<DisclosureCheck>) {
        let sections = agents
            .iter()
            .zip(self.agents)
            .map(|((name, first_seq, last_seq, records), a)| {
                let chart = a.chart();
                let mut outcomes: Vec<StatusCount> = a
                    .statuses
                    .iter()
                    .map(|(s, c)| StatusCount {
                        status: (*s).to_owned(),
                        count: *c,
                    })
                    .collect();
                outcomes.sort_by_key(|s| (s.status != "ok", s.status.clone()));
                let mut open: Vec<&Open> = a.open.values().filter(|o| o.in_period).collect();
                open.sort_by_key(|o| o.seq);
                let open_more = open.len().saturating_sub(MAX_LISTED) as u64;
                let open_calls: Vec<(&String, &Open)> = {
                    let mut v: Vec<(&String, &Open)> =
                        a.open.iter().filter(|(_, o)| o.in_period).collect();
                    v.sort_by_key(|(_, o)| o.seq);
                    v.truncate(MAX_LISTED);
                    v
                };
                AgentSection {
                    agent: name.clone(),
                    first_seq: *first_seq,
                    last_seq: *last_seq,
                    records: *records,
                    period_records: a.period_records,
                    first_time: a.first.map(rfc3339),
                    last_time: a.last.map(rfc3339),
                    calls: a.calls,
                    chart,
                    outcomes,
                    not_ok: a.not_ok,
                    not_ok_more: a.not_ok_more,
                    open: open_calls
                        .into_iter()
                        .map(|(id, o)| CallRef {
                            seq: o.seq,
                            time: rfc3339(o.time),
                            call_id: id.clone(),
                            tool: Some(o.tool.clone()),
                            status: "open".into(),
                        })
                        .collect(),
                    open_more,
                    key_changes: a.key_changes,
                    statements: Vec::new(),
                    named_by_checks: Vec::new(),
                }
            })
            .collect();
        let names: Vec<&str> = agents.iter().map(|a| a.0.as_str()).collect();
        let checks = self
            .disclosures
            .into_iter()
            .map(|p| conclude(p, &names))
            .collect();
        (sections, checks)
    }
}

/// Whether one disclosed part matches record `r`, which has the seq the
/// part names.
fn judge(d: &Disclosure, is_output: bool, r: &Record) -> Result<(), String> {
    let name = format!("{}#{}", r.agent.as_str(), r.seq.get());
    let (call_id, hash, what): (&str, Option<Hash>, &str) = match (&r.body, is_output) {
        (Body::Decision(x), false) => (&x.call_id, Some(x.input_hash), "input_hash"),
        (Body::Outcome(x), true) => (&x.call_id, x.output_hash, "output_hash"),
        (b, _) => {
            return Err(format!(
                "{name} is a {} record, not the {} of a call",
                b.kind().as_str(),
                if is_output { "outcome" } else { "decision" }
            ))
        }
    };
    if call_id != d.call_id {
        return Err(format!(
            "{name} is of call {call_id:?}, not {:?}",
            d.call_id
        ));
    }
    let Some(want) = hash else {
        return Err(format!(
            "{name} has no output_hash: the call ended without a result or error to disclose"
        ));
    };
    let part = if is_output { &d.output } else { &d.input };
    let Some(part) = part else {
        return Err("internal: part missing".into());
    };
    match part.hash() {
        Ok(h) if h == want => Ok(()),
        Ok(h) => Err(format!(
            "{} does not match {name}'s {what}: SHA-256(salt ‖ JCS(content)) is {}, the record has {}",
            if is_output { "output" } else { "input" },
            h.to_hex(),
            want.to_hex()
        )),
        Err(e) => Err(format!("{}: {e}", if is_output { "output" } else { "input" })),
    }
}

fn conclude(p: Pending, agents: &[&str]) -> DisclosureCheck {
    let d = &p.d;
    let mut problems = Vec::new();
    let mut missing = Vec::new();
    for (is_output, part, got) in [(false, &d.input, &p.input), (true, &d.output, &p.output)] {
        let Some(part) = part else { continue };
        match got {
            None => missing.push(format!("{}#{}", d.agent, part.seq)),
            Some(Err(why)) => problems.push(why.clone()),
            Some(Ok(())) => {
                let _ = is_output;
            }
        }
    }
    let (status, message) = if !missing.is_empty() {
        let why = if agents.contains(&d.agent.as_str()) {
            format!(
                "{} not among the pack's verified records",
                if missing.len() == 1 { "is" } else { "are" }
            )
        } else {
            format!("is not in the pack: the pack holds no agent {:?}", d.agent)
        };
        (
            DisclosureStatus::NotInPack,
            format!("call {:?}: {} {why}", d.call_id, missing.join(" and ")),
        )
    } else if !problems.is_empty() {
        (DisclosureStatus::Mismatch, problems.join("; "))
    } else {
        let parts: Vec<String> = [("input", &d.input), ("output", &d.output)]
            .iter()
            .filter_map(|(n, x)| x.as_ref().map(|x| format!("{n} ({}#{})", d.agent, x.seq)))
            .collect();
        (
            DisclosureStatus::Match,
            format!(
                "call {:?}: {} match{} the salted hash{} of the record{}",
                d.call_id,
                parts.join(" and "),
                if parts.len() == 1 { "es" } else { "" },
                if parts.len() == 1 { "" } else { "es" },
                if parts.len() == 1 { "" } else { "s" },
            ),
        )
    };
    let matched = status == DisclosureStatus::Match;
    DisclosureCheck {
        file: p.file,
        agent: d.agent.clone(),
        call_id: d.call_id.clone(),
        status,
        message,
        input_seq: d.input.as_ref().map(|x| x.seq),
        input: d
            .input
            .as_ref()
            .filter(|_| matched)
            .map(|x| x.content.clone()),
        output_seq: d.output.as_ref().map(|x| x.seq),
        output: d
            .output
            .as_ref()
            .filter(|_| matched)
            .map(|x| x.content.clone()),
    }
}
