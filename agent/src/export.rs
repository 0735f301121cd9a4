//! Delivery: finished batches wait in a queue bounded in bytes; one task
//! sends them in order over OTLP/gRPC and retries with backoff while the
//! server is unreachable. When the bound is reached the oldest batches are
//! dropped, and every dropped or rejected sample is counted.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use symtrace_proto::collector::profiles_service_client::ProfilesServiceClient;
use symtrace_proto::collector::ExportProfilesServiceRequest;
use tokio::sync::Notify;
use tonic::codec::CompressionEncoding;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

struct Pending {
    request: Arc<ExportProfilesServiceRequest>,
    samples: u64,
    bytes: usize,
    id: u64,
}

/// What happened to the batches so far.
#[derive(Debug, Default, Clone, Copy)]
pub struct Delivery {
    pub delivered_samples: u64,
    pub delivered_batches: u64,
    /// Dropped because the queue was full (the oldest go first).
    pub dropped_samples: u64,
    pub dropped_batches: u64,
    /// Refused by the server (invalid) or partially rejected.
    pub rejected_samples: u64,
    pub queued_batches: usize,
    pub queued_bytes: usize,
    pub failed_attempts: u64,
}

#[derive(Default)]
struct Inner {
    batches: VecDeque<Pending>,
    next_id: u64,
    stats: Delivery,
    closed: bool,
}

/// The bounded queue between the sampler thread and the export task.
pub struct Queue {
    inner: Mutex<Inner>,
    notify: Notify,
    limit: usize,
}

impl Queue {
    pub fn new(limit_bytes: usize) -> Arc<Queue> {
        Arc::new(Queue {
            inner: Mutex::new(Inner::default()),
            notify: Notify::new(),
            limit: limit_bytes,
        })
    }

    /// Queues a batch, dropping the oldest ones while over the bound (a
    /// batch bigger than the whole bound is dropped itself).
    pub fn push(&self, request: ExportProfilesServiceRequest, samples: u64) {
        let bytes = request.encoded_len();
        {
            let mut q = self.inner.lock().unwrap();
            while bytes <= self.limit
                && !q.batches.is_empty()
                && q.stats.queued_bytes + bytes > self.limit
            {
                let old = q.batches.pop_front().unwrap();
                q.stats.queued_bytes -= old.bytes;
                q.stats.dropped_samples += old.samples;
                q.stats.dropped_batches += 1;
                tracing::warn!(
                    samples = old.samples,
                    "export queue full ({} bytes): dropped the oldest batch",
                    self.limit
                );
            }
            if bytes > self.limit {
                q.stats.dropped_samples += samples;
                q.stats.dropped_batches += 1;
                tracing::warn!(
                    bytes,
                    samples,
                    "batch larger than the export queue: dropped"
                );
            } else {
                let id = q.next_id;
                q.next_id += 1;
                q.stats.queued_bytes += bytes;
                q.batches.push_back(Pending {
                    request: Arc::new(request),
                    samples,
                    bytes,
                    id,
                });
            }
            q.stats.queued_batches = q.batches.len();
        }
        self.notify.notify_one();
    }

    pub fn stats(&self) -> Delivery {
        self.inner.lock().unwrap().stats
    }

    /// No more batches will come: the export task ends once the queue is
    /// empty.
    pub fn close(&self) {
        self.inner.lock().unwrap().closed = true;
        self.notify.notify_one();
    }

    fn front(&self) -> Result<Option<(u64, Arc<ExportProfilesServiceRequest>, u64)>, ()> {
        let q = self.inner.lock().unwrap();
        match q.batches.front() {
            Some(p) => Ok(Some((p.id, p.request.clone(), p.samples))),
            None if q.closed => Err(()),
            None => Ok(None),
        }
    }

    /// Removes batch `id` if it is still queued (it may have been dropped
    /// for room meanwhile), counting it as delivered or rejected.
    fn done(&self, id: u64, rejected: u64) {
        let mut q = self.inner.lock().unwrap();
        if q.batches.front().is_some_and(|p| p.id == id) {
            let p = q.batches.pop_front().unwrap();
            q.stats.queued_bytes -= p.bytes;
            q.stats.queued_batches = q.batches.len();
            let rejected = rejected.min(p.samples);
            q.stats.rejected_samples += rejected;
            q.stats.delivered_samples += p.samples - rejected;
            q.stats.delivered_batches += 1;
        }
    }

    fn failed(&self) {
        self.inner.lock().unwrap().stats.failed_attempts += 1;
    }
}

/// Where and as whom to export.
pub struct Target {
    pub endpoint: String,
    pub tenant: Option<String>,
    pub token: Option<String>,
    pub timeout: Duration,
}

const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(15);

/// Sends queued batches in order until the queue is closed and empty.
pub async fn run(
    queue: Arc<Queue>,
    target: Target,
    health: Arc<crate::health::Health>,
) -> anyhow::Result<()> {
    let channel: Channel = Endpoint::from_shared(target.endpoint.clone())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(target.timeout)
        .connect_lazy();
    let mut client = ProfilesServiceClient::new(channel)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(4 << 20);
    let mut backoff = BACKOFF_MIN;
    loop {
        health.queued(queue.stats().queued_batches as u64);
        let (id, request, samples) = match queue.front() {
            Ok(Some(front)) => front,
            Ok(None) => {
                queue.notify.notified().await;
                continue;
            }
            Err(()) => return Ok(()),
        };
        let mut call = tonic::Request::new((*request).clone());
        if let Some(tenant) = &target.tenant {
            call.metadata_mut()
                .insert("x-scope-orgid", MetadataValue::try_from(tenant.as_str())?);
        }
        if let Some(token) = &target.token {
            call.metadata_mut().insert(
                "authorization",
                MetadataValue::try_from(format!("Bearer {token}"))?,
            );
        }
        match client.export(call).await {
            Ok(response) => {
                backoff = BACKOFF_MIN;
                let rejected = response
                    .into_inner()
                    .partial_success
                    .filter(|p| p.rejected_profiles > 0)
                    .map(|p| {
                        tracing::warn!(
                            rejected_profiles = p.rejected_profiles,
                            "server rejected part of a batch: {}",
                            p.error_message
                        );
                        // Profiles, not samples: count the whole batch's
                        // share conservatively as rejected.
                        samples * p.rejected_profiles as u64
                            / request.resource_profiles.len().max(1) as u64
                    })
                    .unwrap_or(0);
                tracing::debug!(samples, "batch delivered");
                queue.done(id, rejected);
                health.delivered(queue.stats().queued_batches as u64);
            }
            Err(status) if retryable(status.code()) => {
                queue.failed();
                tracing::warn!(
                    "export to {} failed ({}: {}); retrying in {:?}",
                    target.endpoint,
                    status.code(),
                    status.message(),
                    backoff
                );
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    // A close cuts the wait short for the final attempt.
                    _ = queue.notify.notified() => {}
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            Err(status) => {
                queue.failed();
                tracing::error!(
                    samples,
                    "server refused a batch ({}: {}); dropped",
                    status.code(),
                    status.message()
                );
                queue.done(id, samples);
            }
        }
    }
}

/// Whether trying again later may succeed: the server or the network is
/// down or overloaded. Refusals of the data itself are not retried.
fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Internal
            | Code::Unknown
            | Code::Cancelled
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use symtrace_proto::profiles::ProfilesDictionary;

    fn request(strings: usize) -> ExportProfilesServiceRequest {
        ExportProfilesServiceRequest {
            resource_profiles: vec![],
            dictionary: Some(ProfilesDictionary {
                string_table: vec!["x".repeat(100); strings],
                ..Default::default()
            }),
        }
    }

    #[test]
    fn drops_the_oldest_batches_beyond_the_bound_and_counts_them() {
        let one = request(10).encoded_len();
        let queue = Queue::new(one * 3);
        for _ in 0..5 {
            queue.push(request(10), 7);
        }
        let s = queue.stats();
        assert_eq!(
            (s.queued_batches, s.dropped_batches, s.dropped_samples),
            (3, 2, 14)
        );
        assert_eq!(s.queued_bytes, one * 3);
        // The front is the oldest kept (id 2); delivering it frees its room.
        let (id, _, samples) = queue.front().unwrap().unwrap();
        assert_eq!((id, samples), (2, 7));
        queue.done(id, 0);
        // A stale id (dropped meanwhile) changes nothing.
        queue.done(id, 0);
        let s = queue.stats();
        assert_eq!(
            (s.queued_batches, s.delivered_samples, s.delivered_batches),
            (2, 7, 1)
        );
        // Bigger than the whole bound: dropped itself, the queue kept.
        queue.push(request(100), 5);
        let s = queue.stats();
        assert_eq!((s.queued_batches, s.dropped_samples), (2, 19));
        queue.close();
        assert!(
            queue.front().unwrap().is_some(),
            "closing keeps queued batches"
        );
    }
}
