//! Request bodies with a deadline, and answers whose progress the
//! connection's watchdog can see (docs/operations.md "Connections").

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{sleep_until, Instant, Sleep};

use super::state::ConnectionStats;

/// A request body that did not arrive by its deadline. The routes answer
/// it with `408 body_timeout` (docs/api.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request body did not arrive in time: {received} bytes in {} s", elapsed.as_secs())]
pub(crate) struct BodyTimeout {
    /// Bytes that did arrive.
    pub received: u64,
    /// Time from the request head to the cut-off.
    pub elapsed: Duration,
}

/// When a request body must be complete.
#[derive(Debug, Clone)]
pub(crate) struct BodyLimits {
    /// The deadline for a body, from its head.
    pub timeout: Duration,
    /// One more second per this many bytes received; 0: none.
    pub min_rate: u64,
    /// Where cut-offs are counted.
    pub stats: Arc<ConnectionStats>,
}

/// A request body with a deadline (see [`BodyLimits`]).
pub(crate) struct DeadlineBody<B> {
    inner: B,
    started: Instant,
    limits: BodyLimits,
    received: u64,
    timer: Option<Pin<Box<Sleep>>>,
    timed_out: bool,
}

impl<B> DeadlineBody<B> {
    /// `inner`, whose head arrived now.
    pub(crate) fn new(inner: B, limits: BodyLimits) -> Self {
        Self {
            inner,
            started: Instant::now(),
            limits,
            received: 0,
            timer: None,
            timed_out: false,
        }
    }

    fn deadline(&self) -> Instant {
        let extra = match self.limits.min_rate {
            0 => Duration::ZERO,
            rate => Duration::from_secs_f64(self.received as f64 / rate as f64),
        };
        self.started + self.limits.timeout + extra
    }
}

impl<B> HttpBody for DeadlineBody<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.timed_out {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let deadline = this.deadline();
                let timer = match &mut this.timer {
                    Some(t) => {
                        if t.deadline() != deadline {
                            t.as_mut().reset(deadline);
                        }
                        t
                    }
                    None => this.timer.insert(Box::pin(sleep_until(deadline))),
                };
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.timed_out = true;
                this.limits
                    .stats
                    .body_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                Poll::Ready(Some(Err(Box::new(BodyTimeout {
                    received: this.received,
                    elapsed: this.started.elapsed(),
                }))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.timed_out || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The [`BodyTimeout`] that `e` is or wraps, if any.
#[must_use]
pub(crate) fn body_timeout(e: &(dyn std::error::Error + 'static)) -> Option<BodyTimeout> {
    std::iter::successors(Some(e), |e| e.source())
        .find_map(|e| e.downcast_ref::<BodyTimeout>().copied())
}

/// Whether `e` is, or wraps, a request body cut off by its deadline (for
/// routes that read bodies through other extractors, such as multipart:
/// they answer it `408`, docs/api.md "Errors").
#[must_use]
pub fn is_body_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    body_timeout(e).is_some()
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;

    use axum::body::Bytes;
    use hyper::body::Frame;

    use super::super::ConnectionStats;
    use super::*;

    fn limits(timeout_ms: u64, min_rate: u64) -> BodyLimits {
        BodyLimits {
            timeout: Duration::from_millis(timeout_ms),
            min_rate,
            stats: Arc::new(ConnectionStats::default()),
        }
    }

    type Frames = tokio::sync::mpsc::Sender<Result<Frame<Bytes>, Infallible>>;

    /// A body fed by the test through a channel.
    fn channel_body() -> (
        Frames,
        impl HttpBody<Data = Bytes, Error = Infallible> + Unpin,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let frames = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|frame| (frame, rx))
        });
        (tx, http_body_util::StreamBody::new(Box::pin(frames)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_fails_at_its_deadline() {
        use http_body_util::BodyExt as _;
        let (tx, body) = channel_body();
        let l = limits(1_000, 0);
        let stats = Arc::clone(&l.stats);
        let mut body = DeadlineBody::new(body, l);
        tx.send(Ok(Frame::data(Bytes::from_static(b"{"))))
            .await
            .unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        let started = Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(body_timeout(err.as_ref()).is_some(), "{err}");
        assert_eq!(started.elapsed(), Duration::from_millis(1_000));
        assert_eq!(stats.body_timeouts.load(Ordering::Relaxed), 1);
        // After the cut-off the body ends.
        assert!(body.frame().await.is_none());
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_arriving_at_the_minimum_rate_extend_the_deadline() {
        use http_body_util::BodyExt as _;
        let (tx, body) = channel_body();
        // 1 s, plus 1 s per 100 bytes received.
        let mut body = DeadlineBody::new(body, limits(1_000, 100));
        let feeder = tokio::spawn(async move {
            for _ in 0..5 {
                // 100 bytes every 0.9 s: each earns one more second.
                tokio::time::sleep(Duration::from_millis(900)).await;
                tx.send(Ok(Frame::data(Bytes::from(vec![b' '; 100]))))
                    .await
                    .unwrap();
            }
            tx
        });
        let started = Instant::now();
        let mut received = 0;
        let err = loop {
            match body.frame().await {
                Some(Ok(f)) => received += f.into_data().map_or(0, |d| d.len()),
                Some(Err(e)) => break e,
                None => panic!("the body ended"),
            }
        };
        // 500 bytes by 4.5 s earn a deadline of 1 + 5 = 6 s.
        assert_eq!(received, 500);
        assert_eq!(body_timeout(err.as_ref()).map(|t| t.received), Some(500));
        assert_eq!(started.elapsed(), Duration::from_millis(6_000));
        drop(feeder);
    }

    #[tokio::test(start_paused = true)]
    async fn a_complete_body_is_passed_through() {
        use http_body_util::BodyExt as _;
        let (tx, body) = channel_body();
        let body = DeadlineBody::new(body, limits(1_000, 0));
        tx.send(Ok(Frame::data(Bytes::from_static(b"hello"))))
            .await
            .unwrap();
        drop(tx);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"hello");
    }
}
