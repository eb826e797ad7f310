//! The `tally_pending` table (migration 0004; docs/storage.md,
//! "PostgreSQL layout"): how a front that does not sequence hands admitted
//! requests to the one that does, and gets their answers back. The rows are
//! opaque text here; `crate::front` encodes them. None of these writes
//! needs the lease: they are not the log.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{AsyncMessage, Client};

use super::sql::backend;
use super::tls::Connector;
use super::{PostgresStore, ANSWERS_CHANNEL, PENDING_CHANNEL};
use crate::store::OpenRow;
use crate::store::{HandOver, StoreError};

impl HandOver for PostgresStore {
    /// Inserts one row per request, `(received, items)`, in order, and
    /// notifies [`PENDING_CHANNEL`]; the new rows' ids, in the same order.
    ///
    /// # Errors
    /// [`StoreError::Backend`] (the rows may or may not have landed).
    fn pending_insert(
        &self,
        front: &str,
        requests: &[(i64, String)],
    ) -> Result<Vec<i64>, StoreError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let received: Vec<i64> = requests.iter().map(|(r, _)| *r).collect();
        let items: Vec<&str> = requests.iter().map(|(_, i)| i.as_str()).collect();
        self.read(async |c| {
            // nextval is taken in the SELECT's order, so the ids, sorted,
            // are the requests' order.
            let rows = c
                .query(
                    "INSERT INTO tally_pending (front, received, items)
                     SELECT $1, r, i FROM unnest($2::bigint[], $3::text[])
                          WITH ORDINALITY AS t(r, i, o) ORDER BY o
                     RETURNING id",
                    &[&front, &received, &items],
                )
                .await
                .map_err(|e| backend(&e))?;
            let mut ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
            ids.sort_unstable();
            c.execute("SELECT pg_notify($1, '')", &[&PENDING_CHANNEL])
                .await
                .map_err(|e| backend(&e))?;
            Ok(ids)
        })
    }

    /// Up to `limit` unanswered requests in id order, leaving out `skip`
    /// (those being integrated already).
    ///
    /// # Errors
    /// [`StoreError::Backend`].
    fn pending_open(&self, skip: &[i64], limit: i64) -> Result<Vec<OpenRow>, StoreError> {
        self.read(async |c| {
            let rows = c
                .query(
                    "SELECT id, received, items FROM tally_pending
                     WHERE answers IS NULL AND id <> ALL($1::bigint[])
                     ORDER BY id LIMIT $2",
                    &[&skip, &limit],
                )
                .await
                .map_err(|e| backend(&e))?;
            Ok(rows
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect())
        })
    }

    /// Writes answers `(id, answers)` of requests not answered yet (the
    /// first answer stands), then notifies [`ANSWERS_CHANNEL`]. Durable
    /// when it returns (a synchronous commit).
    ///
    /// # Errors
    /// [`StoreError::Backend`].
    fn pending_answer(&self, answers: &[(i64, String)]) -> Result<(), StoreError> {
        if answers.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = answers.iter().map(|(i, _)| *i).collect();
        let texts: Vec<&str> = answers.iter().map(|(_, a)| a.as_str()).collect();
        self.read(async |c| {
            c.execute(
                "UPDATE tally_pending p SET answers = a.answers, answered_at = clock_timestamp()
                 FROM unnest($1::bigint[], $2::text[]) AS a(id, answers)
                 WHERE p.id = a.id AND p.answers IS NULL",
                &[&ids, &texts],
            )
            .await
            .map_err(|e| backend(&e))?;
            c.execute("SELECT pg_notify($1, '')", &[&ANSWERS_CHANNEL])
                .await
                .map_err(|e| backend(&e))?;
            Ok(())
        })
    }

    /// The answers written so far for the requests `ids`.
    ///
    /// # Errors
    /// [`StoreError::Backend`].
    fn pending_answers(&self, ids: &[i64]) -> Result<Vec<(i64, String)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.read(async |c| {
            let rows = c
                .query(
                    "SELECT id, answers FROM tally_pending
                     WHERE id = ANY($1::bigint[]) AND answers IS NOT NULL",
                    &[&ids],
                )
                .await
                .map_err(|e| backend(&e))?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }

    /// Deletes answered requests: `ids`, and every one answered more than
    /// `older_than_secs` ago (nobody came back for it).
    ///
    /// # Errors
    /// [`StoreError::Backend`].
    fn pending_delete(&self, ids: &[i64], older_than_secs: f64) -> Result<u64, StoreError> {
        self.read(async |c| {
            c.execute(
                "DELETE FROM tally_pending WHERE answers IS NOT NULL
                 AND (id = ANY($1::bigint[])
                      OR answered_at < clock_timestamp() - $2::float8 * interval '1 second')",
                &[&ids, &older_than_secs],
            )
            .await
            .map_err(|e| backend(&e))
        })
    }

    fn on_requests(&self) -> Result<Arc<tokio::sync::Notify>, StoreError> {
        self.listen(PENDING_CHANNEL)
    }

    fn on_answers(&self) -> Result<Arc<tokio::sync::Notify>, StoreError> {
        self.listen(ANSWERS_CHANNEL)
    }
}

impl PostgresStore {
    /// LISTENs on `channel` on a connection of its own and wakes the
    /// returned `Notify` on each notification. When that connection ends it
    /// is reopened, with a back-off from 100 ms doubling to 5 s, and the
    /// `Notify` is woken once it listens again (notifications sent
    /// meanwhile are lost); callers poll as well.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the first connection or LISTEN fails.
    pub fn listen(&self, channel: &str) -> Result<Arc<tokio::sync::Notify>, StoreError> {
        let rt = self
            .pg
            .runtime()
            .ok_or_else(|| StoreError::Backend("postgresql store is closed".into()))?;
        let connector = self.pg.connector().clone();
        let notify = Arc::new(tokio::sync::Notify::new());
        let wake = Arc::clone(&notify);
        let channel = channel.to_owned();
        let first = rt.spawn(async move {
            let first = open_listener(&connector, &channel, &wake).await?;
            tokio::spawn(keep_listening(connector, channel, wake, first));
            Ok::<_, tokio_postgres::Error>(())
        });
        match futures::executor::block_on(first) {
            Ok(Ok(())) => Ok(notify),
            Ok(Err(e)) if e.as_db_error().is_some() => Err(backend(&e)),
            Ok(Err(e)) => Err(StoreError::Backend(self.pg.connector().explain(&e))),
            Err(e) => Err(StoreError::Backend(format!("postgresql listen: {e}"))),
        }
    }
}

/// A LISTEN connection: its client, and the task that reads its messages
/// (it ends when the connection does).
type Listener = (Client, tokio::task::JoinHandle<()>);

/// Connects, LISTENs on `channel`, and wakes `wake` on each notification.
async fn open_listener(
    connector: &Connector,
    channel: &str,
    wake: &Arc<tokio::sync::Notify>,
) -> Result<Listener, tokio_postgres::Error> {
    let (client, mut connection) = connector.connect().await?;
    let (wake, name) = (Arc::clone(wake), channel.to_owned());
    let messages = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(m) = futures::StreamExt::next(&mut messages).await {
            match m {
                Ok(AsyncMessage::Notification(_)) => wake.notify_one(),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("postgresql LISTEN {name} ended: {e}; reopening it");
                    return;
                }
            }
        }
        tracing::warn!("postgresql LISTEN {name} ended; reopening it");
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    Ok((client, messages))
}

/// Keeps a LISTEN on `channel` open for as long as the store's runtime
/// runs: each time the connection ends it is reopened, with back-off.
async fn keep_listening(
    connector: Connector,
    channel: String,
    wake: Arc<tokio::sync::Notify>,
    first: Listener,
) {
    const FIRST: Duration = Duration::from_millis(100);
    const MOST: Duration = Duration::from_secs(5);
    let (mut client, mut messages) = first;
    loop {
        let _ = (&mut messages).await;
        drop(client);
        let mut backoff = FIRST;
        (client, messages) = loop {
            tokio::time::sleep(backoff).await;
            match open_listener(&connector, &channel, &wake).await {
                Ok(l) => break l,
                Err(e) => {
                    backoff = (backoff * 2).min(MOST);
                    tracing::warn!(
                        "reopening postgresql LISTEN {channel} failed: {e}; next try in {backoff:?}"
                    );
                }
            }
        };
        tracing::info!("postgresql LISTEN {channel} reopened");
        // Whatever was notified while it was closed is looked at now.
        wake.notify_one();
    }
}
