//! The measured work, the library's and the raw driver's: claim+commit one message at a
//! time (with a share of redeliveries) and in batches.

use std::sync::Arc;
use std::time::Duration;

use dedup_core::{Claim, ClaimOptions, ClaimRequest, CommitRequest, DedupStore, Key, ManualClock};

use super::Result;
use super::driver::{Run, drive};
use super::target::Raw;

/// The lease every bench claim asks for (never runs out during the bench).
const LEASE: Duration = Duration::from_secs(30);

pub(crate) fn message_id(i: usize) -> String {
    format!("m{i}")
}

/// Delivery `i` of a stream in which `percent` % of the deliveries are redeliveries: the
/// message it carries, and whether that message was delivered before. Redeliveries are
/// spread evenly (exactly `percent` of every 100 deliveries) and carry the message
/// delivered first half-way back in the stream, usually processed by then (at high
/// concurrency an early one may still be in flight: a duplicate either way).
fn delivery(i: usize, percent: usize) -> (usize, bool) {
    let percent = percent.min(90);
    let redeliveries_before = |i: usize| i * percent / 100;
    let fresh_before = i - redeliveries_before(i);
    if redeliveries_before(i + 1) > redeliveries_before(i) {
        (fresh_before / 2, true)
    } else {
        (fresh_before, false)
    }
}

/// Claim then commit keys of `consumer` through the library, one at a time per task;
/// `duplicate_percent` % of the deliveries are redeliveries (see [`delivery`]), whose
/// claim answers `Completed` (or `InFlight`) and is left at that. Without redeliveries, a
/// key that is not acquired fails the run; with them, a first delivery may find its key
/// taken by a redelivery that overtook it (other tasks run concurrently), which is the same
/// work in the other order.
pub(crate) async fn single(
    store: Arc<dyn DedupStore>,
    consumer: Arc<str>,
    concurrency: usize,
    duplicate_percent: usize,
    more: impl Fn(usize) -> bool + Send + Sync + 'static,
) -> Result<Run> {
    drive(concurrency, more, move |_, i| {
        let (store, consumer) = (Arc::clone(&store), Arc::clone(&consumer));
        async move {
            let (message, _) = delivery(i, duplicate_percent);
            let key = Key::new(&*consumer, message_id(message))?;
            match store.claim(&key, &ClaimOptions::lease(LEASE)).await? {
                Claim::Acquired(lease) => store.commit(&lease, None).await?,
                Claim::Completed { .. } | Claim::InFlight { .. } if duplicate_percent > 0 => {}
                other => return Err(format!("claim of fresh key {key:?}: {other:?}").into()),
            }
            Ok(())
        }
    })
    .await
}

/// The raw baseline of [`single`] (a duplicate is what a claim that is not acquired is to
/// the library).
pub(crate) async fn raw_single(
    raw: Arc<dyn Raw>,
    consumer: Arc<str>,
    concurrency: usize,
    duplicate_percent: usize,
    n: usize,
) -> Result<Run> {
    drive(
        concurrency,
        move |i| i < n,
        move |worker, i| {
            let (message, _) = delivery(i, duplicate_percent);
            let done = raw.claim_commit(worker, Arc::clone(&consumer), message_id(message));
            async move {
                match done.await? {
                    true => Ok(()),
                    false if duplicate_percent > 0 => Ok(()),
                    false => {
                        Err(format!("raw claim of fresh message {message}: a duplicate").into())
                    }
                }
            }
        },
    )
    .await
}

/// The message ids of batch `b` of `total` messages in batches of `size`, or `None` past
/// the end.
fn batch_ids(b: usize, total: usize, size: usize) -> Option<Vec<String>> {
    Some(batch_range(b, total, size)?.map(message_id).collect())
}

/// The message numbers of batch `b` of `total` messages in batches of `size`, or `None`
/// past the end.
fn batch_range(b: usize, total: usize, size: usize) -> Option<std::ops::Range<usize>> {
    let start = b.checked_mul(size).filter(|s| *s < total)?;
    Some(start..total.min(start + size))
}

/// How a batch of [`batches_each`] names its messages.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ids {
    /// `m<i>`, numbered through the run ([`message_id`]).
    Numbered,
    /// Random UUIDs, as a consumer receives them (the scale mode's, `counted` feature).
    #[cfg_attr(not(feature = "counted"), allow(dead_code))]
    Random,
}

impl Ids {
    /// The message ids of batch `b` of `total` messages in batches of `size`, or `None`
    /// past the end.
    fn of(self, b: usize, total: usize, size: usize) -> Option<Vec<String>> {
        match self {
            Ids::Numbered => batch_ids(b, total, size),
            Ids::Random => Some(
                batch_range(b, total, size)?
                    .map(|_| uuid::Uuid::new_v4().to_string())
                    .collect(),
            ),
        }
    }
}

/// `claim_many` then `commit_many` of `total` fresh keys in batches of `size`.
pub(crate) async fn batches(
    store: Arc<dyn DedupStore>,
    consumer: Arc<str>,
    concurrency: usize,
    total: usize,
    size: usize,
) -> Result<Run> {
    batches_each(
        store,
        consumer,
        concurrency,
        total,
        size,
        Ids::Numbered,
        || {},
    )
    .await
}

/// How far [`aged_batches`] moves the clock on before each batch: 10 M records in batches
/// of 1 000 span 10 s, well inside any purge retention the bench uses.
const AGED_TICK: Duration = Duration::from_millis(1);

/// [`batches`] on a store running on `clock`, which moves on by [`AGED_TICK`] before each
/// batch, so the records' claim times spread as a consumer's do over time (a clock that
/// stands still gives them all one `claimed_at`, which no store in service holds and which
/// slows the SQL stores' purges: each batch steps again over the index entries of the
/// records deleted before it).
pub(crate) async fn aged_batches(
    store: Arc<dyn DedupStore>,
    clock: Arc<ManualClock>,
    consumer: Arc<str>,
    concurrency: usize,
    total: usize,
    size: usize,
    ids: Ids,
) -> Result<Run> {
    let tick = move || clock.advance(AGED_TICK);
    batches_each(store, consumer, concurrency, total, size, ids, tick).await
}

/// [`batches`] with the messages named by `ids`, calling `before` as each batch starts.
async fn batches_each(
    store: Arc<dyn DedupStore>,
    consumer: Arc<str>,
    concurrency: usize,
    total: usize,
    size: usize,
    ids: Ids,
    before: impl Fn() + Send + Sync + 'static,
) -> Result<Run> {
    let size = size.max(1);
    drive(
        concurrency,
        move |b| b * size < total,
        move |_, b| {
            let (store, consumer) = (Arc::clone(&store), Arc::clone(&consumer));
            before();
            async move {
                let ids = ids.of(b, total, size).unwrap_or_default();
                let requests = ids
                    .into_iter()
                    .map(|id| {
                        Key::new(&*consumer, id)
                            .map(|key| ClaimRequest::new(key, ClaimOptions::lease(LEASE)))
                    })
                    .collect::<dedup_core::Result<Vec<_>>>()?;
                let mut commits = Vec::with_capacity(requests.len());
                for (request, claim) in requests.iter().zip(store.claim_many(&requests).await?) {
                    match claim? {
                        Claim::Acquired(lease) => commits.push(CommitRequest {
                            lease,
                            outcome: None,
                        }),
                        other => {
                            return Err(
                                format!("claim of fresh key {:?}: {other:?}", request.key).into()
                            );
                        }
                    }
                }
                for committed in store.commit_many(&commits).await? {
                    committed?;
                }
                Ok(())
            }
        },
    )
    .await
}

/// The raw baseline of [`batches`].
pub(crate) async fn raw_batches(
    raw: Arc<dyn Raw>,
    consumer: Arc<str>,
    concurrency: usize,
    total: usize,
    size: usize,
) -> Result<Run> {
    let size = size.max(1);
    drive(
        concurrency,
        move |b| b * size < total,
        move |worker, b| {
            let ids = batch_ids(b, total, size).unwrap_or_default();
            raw.batch(worker, Arc::clone(&consumer), ids)
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redeliveries_are_the_given_share_and_repeat_earlier_messages() {
        let deliveries: Vec<_> = (0..1000).map(|i| delivery(i, 30)).collect();
        assert_eq!(deliveries.iter().filter(|(_, r)| *r).count(), 300);
        let mut fresh = 0;
        for &(message, redelivered) in &deliveries {
            if redelivered {
                assert!(
                    message < fresh,
                    "redelivery of {message} before it was sent"
                );
            } else {
                assert_eq!(message, fresh, "fresh messages come in order");
                fresh += 1;
            }
        }
        assert!((0..100).all(|i| delivery(i, 0) == (i, false)));
    }

    #[test]
    fn batches_cover_every_message_once() {
        assert_eq!(batch_ids(0, 5, 2).unwrap(), ["m0", "m1"]);
        assert_eq!(batch_ids(2, 5, 2).unwrap(), ["m4"]);
        assert_eq!(batch_ids(3, 5, 2), None);
    }
}
