//! Which offsets of each assigned partition are settled, what may be committed, and the
//! consumer context that keeps that straight across a rebalance.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol,
};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

/// A partition: topic and partition number.
pub(crate) type Partition = (String, i32);

/// One assigned partition's offsets fetched since the last commit, each settled or not.
#[derive(Debug, Default)]
struct Track {
    /// Bumped at each assignment: a delivery fetched under an earlier one no longer counts.
    generation: u64,
    /// Fetched offsets, `true` once settled.
    fetched: BTreeMap<i64, bool>,
    /// One past the settled prefix so far (what is committed, or about to be).
    commit: Option<i64>,
}

impl Track {
    /// Drop the settled prefix; the offset to commit (one past it) when there was one.
    fn advance(&mut self) -> Option<i64> {
        let mut last = None;
        while let Some(entry) = self.fetched.first_entry() {
            if !*entry.get() {
                break;
            }
            last = Some(*entry.key());
            entry.remove();
        }
        let commit = last.map(|o| o + 1);
        if commit.is_some() {
            self.commit = commit;
        }
        commit
    }
}

/// Settled offsets per assigned partition, shared by the source, its pending deliveries
/// and the rebalance callbacks.
#[derive(Clone, Debug, Default)]
pub(crate) struct Offsets(Arc<Mutex<State>>);

#[derive(Debug, Default)]
struct State {
    tracks: HashMap<Partition, Track>,
    next_generation: u64,
}

impl Offsets {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A delivery was fetched at `offset`: the generation it settles under, or `None` when
    /// its partition is not (or no longer) assigned.
    pub(crate) fn fetched(&self, partition: &Partition, offset: i64) -> Option<u64> {
        let mut state = self.lock();
        let track = state.tracks.get_mut(partition)?;
        track.fetched.insert(offset, false);
        Some(track.generation)
    }

    /// The delivery at `offset` is settled: the offset to commit for its partition, if the
    /// settled prefix grew (nothing when the partition was revoked since it was fetched).
    pub(crate) fn settled(
        &self,
        partition: &Partition,
        offset: i64,
        generation: u64,
    ) -> Option<i64> {
        let mut state = self.lock();
        let track = state
            .tracks
            .get_mut(partition)
            .filter(|t| t.generation == generation)?;
        *track.fetched.get_mut(&offset)? = true;
        track.advance()
    }

    /// Start tracking newly assigned partitions (from scratch: the consumer resumes at the
    /// committed offsets).
    fn assign(&self, partitions: &TopicPartitionList) {
        let mut state = self.lock();
        state.next_generation += 1;
        let generation = state.next_generation;
        for p in partitions.elements() {
            state.tracks.insert(
                (p.topic().to_owned(), p.partition()),
                Track {
                    generation,
                    ..Track::default()
                },
            );
        }
    }

    /// Stop tracking revoked partitions: the commits their settled prefixes still owe.
    fn revoke(&self, partitions: &TopicPartitionList) -> TopicPartitionList {
        let mut state = self.lock();
        let mut owed = TopicPartitionList::new();
        for p in partitions.elements() {
            let key = (p.topic().to_owned(), p.partition());
            if let Some(mut track) = state.tracks.remove(&key) {
                track.advance();
                if let Some(offset) = track.commit {
                    let _ = owed.add_partition_offset(&key.0, key.1, Offset::Offset(offset));
                }
            }
        }
        owed
    }

    /// Every tracked partition's settled prefix (one past it), for a final commit.
    pub(crate) fn positions(&self) -> TopicPartitionList {
        let state = self.lock();
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), track) in &state.tracks {
            if let Some(offset) = track.commit {
                let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(offset));
            }
        }
        tpl
    }

    /// Forget every partition (the consumer was closed).
    pub(crate) fn clear(&self) {
        self.lock().tracks.clear();
    }
}

/// The consumer's context: before a revoke, commits what is settled on the revoked
/// partitions and stops tracking them; on an assignment, starts tracking the new ones.
///
/// It applies each rebalance itself, as rdkafka's default does, except that it asks
/// librdkafka for the rebalance protocol once, at the first rebalance (an assignment), and
/// keeps the answer. librdkafka answers that question on its group thread: asked again in
/// the revoke that closing the consumer brings, the call can wait forever (the consumer's
/// drop then hangs; librdkafka issue 4041).
pub(crate) struct Rebalancing {
    offsets: Offsets,
    group: String,
    /// Whether the group rebalances incrementally (cooperative), asked once.
    cooperative: OnceLock<bool>,
}

impl Rebalancing {
    /// A context for a new consumer of `group`, tracking into `offsets`.
    pub(crate) fn new(offsets: Offsets, group: String) -> Self {
        Rebalancing {
            offsets,
            group,
            cooperative: OnceLock::new(),
        }
    }

    fn cooperative(&self, consumer: &BaseConsumer<Self>) -> bool {
        *self.cooperative.get_or_init(|| {
            matches!(
                consumer.rebalance_protocol(),
                RebalanceProtocol::Cooperative
            )
        })
    }
}

impl ClientContext for Rebalancing {}

impl ConsumerContext for Rebalancing {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        let rebalance = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign(partitions),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke(partitions),
            other => Rebalance::Error(KafkaError::Rebalance(other.into())),
        };
        self.pre_rebalance(consumer, &rebalance);
        let applied = match (&rebalance, self.cooperative(consumer)) {
            (Rebalance::Assign(p), true) => consumer.incremental_assign(p),
            (Rebalance::Assign(p), false) => consumer.assign(p),
            (_, true) => consumer.incremental_unassign(partitions),
            (_, false) => consumer.unassign(),
        };
        if let Err(e) = applied {
            tracing::warn!(group = %self.group, error = %dedup_core::error_chain(&e), "could not apply a rebalance");
        }
        self.post_rebalance(consumer, &rebalance);
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            let owed = self.offsets.revoke(partitions);
            if owed.count() > 0
                && let Err(e) = consumer.commit(&owed, CommitMode::Sync)
            {
                tracing::warn!(group = %self.group, error = %dedup_core::error_chain(&e), "could not commit the settled offsets of revoked partitions; their deliveries come again");
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(partitions) => self.offsets.assign(partitions),
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => {
                tracing::warn!(group = %self.group, error = %dedup_core::error_chain(e), "rebalance failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assigned(offsets: &Offsets) -> Partition {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition("orders", 0);
        offsets.assign(&tpl);
        ("orders".to_owned(), 0)
    }

    #[test]
    fn commits_only_past_the_settled_prefix_across_gaps() {
        let offsets = Offsets::default();
        let p = assigned(&offsets);
        // Offsets 3, 4 and 7 fetched (5 and 6 are gaps: compaction, transaction markers).
        let g = [3, 4, 7].map(|o| offsets.fetched(&p, o).unwrap());
        assert_eq!(offsets.settled(&p, 4, g[1]), None, "3 is still in flight");
        assert_eq!(offsets.settled(&p, 7, g[2]), None, "3 is still in flight");
        assert_eq!(offsets.settled(&p, 3, g[0]), Some(8), "3, 4 and 7 settled");
        let positions = offsets.positions();
        assert_eq!(
            positions.find_partition("orders", 0).unwrap().offset(),
            Offset::Offset(8)
        );
    }

    #[test]
    fn a_revoked_partition_owes_its_prefix_and_ignores_late_settles() {
        let offsets = Offsets::default();
        let p = assigned(&offsets);
        let g0 = offsets.fetched(&p, 0).unwrap();
        let g1 = offsets.fetched(&p, 1).unwrap();
        assert_eq!(offsets.settled(&p, 0, g0), Some(1));
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition("orders", 0);
        let owed = offsets.revoke(&tpl);
        assert_eq!(
            owed.find_partition("orders", 0).unwrap().offset(),
            Offset::Offset(1),
            "the settled prefix, not past the unsettled 1"
        );
        assert_eq!(offsets.settled(&p, 1, g1), None, "revoked: no commit");
        // Assigned again: a settle from before counts for nothing.
        let p = assigned(&offsets);
        let fresh = offsets.fetched(&p, 1).unwrap();
        assert_ne!(fresh, g1);
        assert_eq!(offsets.settled(&p, 1, g1), None, "an earlier generation");
        assert_eq!(offsets.settled(&p, 1, fresh), Some(2));
    }

    #[test]
    fn an_unassigned_partition_is_not_tracked() {
        let offsets = Offsets::default();
        assert_eq!(offsets.fetched(&("other".to_owned(), 0), 0), None);
        assert_eq!(offsets.positions().count(), 0);
    }
}
