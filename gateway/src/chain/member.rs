//! A writer that does not hold the agent's chain: it hands each request to
//! the owner over `writer.sock` and remembers it until it is answered
//! (docs/architecture.md "Several writers, one chain").

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tally_schemas::disclosure::Disclosure;
use tally_schemas::{Hash, Record};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use super::wire::{read_frame, write_frame, Answer, Request};
use super::{AppendReply, ChainStatus, Cmd, Reply, Waited, WriterInfo};
use crate::recorder::{answer, AppendError};

pub(super) enum Pending {
    Append {
        request: Request,
        reply: Option<AppendReply>,
    },
    Wait {
        request: Request,
        reply: oneshot::Sender<Waited>,
    },
    Status {
        request: Request,
        reply: oneshot::Sender<Result<ChainStatus, String>>,
    },
    Declare {
        request: Request,
        reply: oneshot::Sender<Result<bool, AppendError>>,
    },
    OpenDecision {
        request: Request,
        reply: oneshot::Sender<Result<Option<Hash>, String>>,
    },
    Disclose {
        request: Request,
        reply: oneshot::Sender<Result<Disclosure, String>>,
    },
}

impl Pending {
    pub(super) fn request(&self) -> &Request {
        match self {
            Self::Append { request, .. }
            | Self::Wait { request, .. }
            | Self::Status { request, .. }
            | Self::Declare { request, .. }
            | Self::OpenDecision { request, .. }
            | Self::Disclose { request, .. } => request,
        }
    }
}

pub(super) struct Member {
    pub(super) to_owner: mpsc::UnboundedSender<Request>,
    pub(super) from_owner: mpsc::UnboundedReceiver<Answer>,
    tasks: [tokio::task::JoinHandle<()>; 2],
}

impl Drop for Member {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub(super) async fn connect(socket: &Path, me: &WriterInfo) -> std::io::Result<Member> {
    let stream = UnixStream::connect(socket).await?;
    let (mut rd, mut wr) = stream.into_split();
    write_frame(
        &mut wr,
        &Request::Hello {
            pid: std::process::id(),
            info: me.clone(),
        },
    )
    .await?;
    let welcome: Option<Answer> = tokio::time::timeout(Duration::from_secs(2), read_frame(&mut rd))
        .await
        .map_err(|_| std::io::Error::other("the chain owner did not answer"))??;
    let Some(Answer::Welcome { .. }) = welcome else {
        return Err(std::io::Error::other(
            "the chain owner did not welcome this writer",
        ));
    };
    let (to_owner, mut rx) = mpsc::unbounded_channel::<Request>();
    let (tx, from_owner) = mpsc::unbounded_channel::<Answer>();
    let writer = tokio::spawn(async move {
        while let Some(r) = rx.recv().await {
            if write_frame(&mut wr, &r).await.is_err() {
                break;
            }
        }
    });
    let reader = tokio::spawn(async move {
        while let Ok(Some(a)) = read_frame::<_, Answer>(&mut rd).await {
            if tx.send(a).is_err() {
                break;
            }
        }
    });
    Ok(Member {
        to_owner,
        from_owner,
        tasks: [writer, reader],
    })
}

/// A member's driver: sends `cmd` to the owner, remembering it until it
/// is answered.
pub(super) fn send_to_owner(
    m: &Member,
    pending: &mut BTreeMap<u64, Pending>,
    next_id: &mut u64,
    cmd: Cmd,
) {
    let id = *next_id;
    *next_id += 1;
    let p = match cmd {
        Cmd::Append {
            body,
            secret,
            durable,
            reply,
        } => {
            let kind = body.kind();
            let body = match serde_json::to_value(&*body) {
                Ok(v) => v,
                Err(e) => {
                    answer(reply, Err(AppendError::Store(e.to_string())));
                    return;
                }
            };
            Pending::Append {
                request: Request::Append {
                    id,
                    kind,
                    body,
                    secret,
                    durable,
                    retry: false,
                },
                reply,
            }
        }
        Cmd::Wait {
            seq,
            timeout,
            one_try,
            reply,
        } => Pending::Wait {
            request: Request::Wait {
                id,
                seq,
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                one_try,
            },
            reply,
        },
        Cmd::Status { reply } => Pending::Status {
            request: Request::Status { id },
            reply,
        },
        Cmd::Declare { tools, reply } => Pending::Declare {
            request: Request::Declare { id, tools },
            reply,
        },
        Cmd::OpenDecision { call_id, reply } => Pending::OpenDecision {
            request: Request::OpenDecision { id, call_id },
            reply,
        },
        Cmd::Disclose {
            agent,
            call_id,
            parts,
            reply,
        } => Pending::Disclose {
            request: Request::Disclose {
                id,
                agent,
                call_id,
                parts,
            },
            reply,
        },
        Cmd::Close { reply } => {
            let _ = reply.send(());
            return;
        }
    };
    let _ = m.to_owner.send(p.request().clone());
    pending.insert(id, p);
}

pub(super) fn on_answer(pending: &mut BTreeMap<u64, Pending>, a: Answer) {
    let id = match &a {
        Answer::Welcome { .. } => return,
        Answer::Appended { id, .. }
        | Answer::Refused { id, .. }
        | Answer::Waited { id, .. }
        | Answer::Status { id, .. }
        | Answer::Declared { id, .. }
        | Answer::Found { id, .. }
        | Answer::Disclosed { id, .. } => *id,
    };
    let Some(p) = pending.remove(&id) else {
        return;
    };
    match (p, a) {
        (Pending::Append { reply, .. }, Answer::Appended { record, .. }) => {
            let r = Record::from_json(record.as_bytes()).map_err(|e| AppendError::Refused {
                code: "bad_answer".into(),
                message: format!("the chain owner answered a record that does not parse: {e}"),
            });
            answer(reply, r);
        }
        (Pending::Append { reply, .. }, Answer::Refused { code, message, .. }) => {
            answer(reply, Err(AppendError::Refused { code, message }));
        }
        (Pending::Wait { reply, .. }, Answer::Waited { waited, .. }) => {
            let _ = reply.send(waited);
        }
        (Pending::Status { reply, .. }, Answer::Status { status, .. }) => {
            let _ = reply.send(Ok(*status));
        }
        (Pending::Status { reply, .. }, Answer::Refused { message, .. }) => {
            let _ = reply.send(Err(message));
        }
        (Pending::Declare { reply, .. }, Answer::Declared { recorded, .. }) => {
            let _ = reply.send(Ok(recorded));
        }
        (Pending::Declare { reply, .. }, Answer::Refused { code, message, .. }) => {
            let _ = reply.send(Err(AppendError::Refused { code, message }));
        }
        (Pending::OpenDecision { reply, .. }, Answer::Found { hash, .. }) => {
            let _ = reply.send(
                hash.map(|h| Hash::from_hex(&h).map_err(|e| e.to_string()))
                    .transpose(),
            );
        }
        (Pending::OpenDecision { reply, .. }, Answer::Refused { message, .. }) => {
            let _ = reply.send(Err(message));
        }
        (Pending::Disclose { reply, .. }, Answer::Disclosed { disclosure, .. }) => {
            let _ = reply.send(Ok(*disclosure));
        }
        (Pending::Disclose { reply, .. }, Answer::Refused { message, .. }) => {
            let _ = reply.send(Err(message));
        }
        (p, a) => fail_pending(p, &format!("the chain owner answered out of turn: {a:?}")),
    }
}

pub(super) fn fail_pending(p: Pending, why: &str) {
    let reply = match p {
        Pending::Append { reply, .. } => Reply::Append(reply),
        Pending::Wait { reply, .. } => Reply::Wait(reply),
        Pending::Status { reply, .. } => Reply::Status(reply),
        Pending::Declare { reply, .. } => Reply::Declare(reply),
        Pending::OpenDecision { reply, .. } => Reply::OpenDecision(reply),
        Pending::Disclose { reply, .. } => Reply::Disclose(reply),
    };
    reply.fail(why);
}
