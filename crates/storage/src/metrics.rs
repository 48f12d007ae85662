//! Per-target metrics of a storage server: operations, bytes, latency and queue depth by
//! target, and each target's space (read at each scrape).

use crate::target::Target;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use std::time::Instant;
use weft_observe::metrics::{latency_histogram, LatencyFamily, SpaceCollector};
use weft_observe::MetricsBuilder;
use weft_proto::messages::TargetStats;
use weft_proto::TargetId;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    target: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetOpLabels {
    target: u32,
    op: &'static str,
}

/// The families a storage server adds to its registry (a clone counts into the same ones).
#[derive(Clone)]
pub(crate) struct TargetMetrics {
    operations: Family<TargetOpLabels, Counter>,
    durations: LatencyFamily<TargetOpLabels>,
    read_bytes: Family<TargetLabels, Counter>,
    written_bytes: Family<TargetLabels, Counter>,
    queue_depth: Family<TargetLabels, Gauge>,
}

impl TargetMetrics {
    pub fn register(builder: &mut MetricsBuilder, targets: Vec<Arc<Target>>) -> TargetMetrics {
        let metrics = TargetMetrics {
            operations: Family::default(),
            durations: LatencyFamily::new_with_constructor(latency_histogram),
            read_bytes: Family::default(),
            written_bytes: Family::default(),
            queue_depth: Family::default(),
        };
        let registry = builder.registry();
        registry.register(
            "weft_storage_operations",
            "Operations on a storage target's disk, by target and operation",
            metrics.operations.clone(),
        );
        registry.register(
            "weft_storage_operation_duration_seconds",
            "Time a storage target's disk operation took, queueing included",
            metrics.durations.clone(),
        );
        registry.register(
            "weft_storage_read_bytes",
            "Bytes read from a storage target",
            metrics.read_bytes.clone(),
        );
        registry.register(
            "weft_storage_written_bytes",
            "Bytes written to a storage target",
            metrics.written_bytes.clone(),
        );
        registry.register(
            "weft_storage_queue_depth",
            "Disk operations queued or running on a storage target",
            metrics.queue_depth.clone(),
        );
        registry.register_collector(Box::new(SpaceCollector(Box::new(move || {
            targets
                .iter()
                .map(|target| (target.id.0.to_string(), target.usage()))
                .collect()
        }))));
        metrics
    }

    /// `target`'s counters since the start, and its space now.
    pub fn stats(&self, target: &Target) -> TargetStats {
        let labels = TargetLabels {
            target: target.id.0,
        };
        let operations = [
            "write",
            "read",
            "truncate",
            "remove",
            "sync",
            "fallocate",
            "list_objects",
            "object_length",
        ]
        .into_iter()
        .map(|op| {
            self.operations
                .get_or_create(&TargetOpLabels {
                    target: target.id.0,
                    op,
                })
                .get()
        })
        .sum();
        TargetStats {
            target: target.id,
            operations,
            read_bytes: self.read_bytes.get_or_create(&labels).get(),
            written_bytes: self.written_bytes.get_or_create(&labels).get(),
            queue_depth: self.queue_depth.get_or_create(&labels).get().max(0) as u64,
            usage: target.usage(),
        }
    }

    /// Counts an operation on `target` from now until [`DiskOp::finish`].
    pub fn start(&self, target: TargetId, op: &'static str) -> DiskOp<'_> {
        self.queue_depth
            .get_or_create(&TargetLabels { target: target.0 })
            .inc();
        DiskOp {
            metrics: self,
            target: target.0,
            op,
            started: Instant::now(),
        }
    }
}

/// A disk operation being timed.
pub(crate) struct DiskOp<'a> {
    metrics: &'a TargetMetrics,
    target: u32,
    op: &'static str,
    started: Instant,
}

impl DiskOp<'_> {
    /// Records the operation with the bytes it read and wrote.
    pub fn finish(self, read: u64, written: u64) {
        let metrics = self.metrics;
        let target = TargetLabels {
            target: self.target,
        };
        let labels = TargetOpLabels {
            target: self.target,
            op: self.op,
        };
        metrics.operations.get_or_create(&labels).inc();
        metrics
            .durations
            .get_or_create(&labels)
            .observe(self.started.elapsed().as_secs_f64());
        if read > 0 {
            metrics.read_bytes.get_or_create(&target).inc_by(read);
        }
        if written > 0 {
            metrics.written_bytes.get_or_create(&target).inc_by(written);
        }
        metrics.queue_depth.get_or_create(&target).dec();
    }
}
