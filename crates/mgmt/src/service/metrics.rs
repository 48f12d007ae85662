//! The cluster as management sees it, for Prometheus: nodes and targets by reachability,
//! storage space by pool, mirror groups' members and versions, live client sessions, and
//! what clients' mounts do not serve. Encoded from the cluster map at each scrape, by the
//! leader only.

use super::Front;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::collections::HashMap;
use std::sync::Arc;
use weft_proto::messages::{ClusterMap, SpaceUsage};
use weft_proto::pools::CapacityClass;

/// The collector registered with management's metrics.
pub(super) struct ClusterCollector(pub Arc<Front>);

impl std::fmt::Debug for ClusterCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterCollector")
    }
}

impl Collector for ClusterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(mgmt) = self.0.leading() else {
            return Ok(());
        };
        let Ok(map) = mgmt.cluster_map() else {
            return Ok(());
        };
        encode_nodes(&map, &mut encoder)?;
        encode_pools(&map, &mut encoder)?;
        encode_mirror_groups(&map, &mut encoder)?;
        let unserved = mgmt
            .live
            .lock()
            .expect("live state poisoned")
            .client_unserved
            .clone();
        let mut family = encoder.encode_descriptor(
            "weft_client_unserved_requests",
            "Requests each client's mount answered with an error because it does not serve them \
             (ioctl, poll, lseek…), by kind, as its heartbeats report them.",
            None,
            MetricType::Counter,
        )?;
        for (client, kinds) in unserved {
            let client = client.to_string();
            for (kind, count) in kinds {
                let labels = [("client", client.as_str()), ("request", kind.as_str())];
                ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// A gauge family `name` with one gauge per label set of `counts`.
fn encode_counts<const LABELS: usize>(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    label_names: [&str; LABELS],
    counts: HashMap<[&str; LABELS], i64>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (values, count) in counts {
        let labels: [(&str, &str); LABELS] =
            std::array::from_fn(|index| (label_names[index], values[index]));
        ConstGauge::new(count).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Nodes and targets by reachability; the cluster's space and live sessions.
fn encode_nodes(map: &ClusterMap, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut nodes: HashMap<[&str; 2], i64> = HashMap::new();
    for node in &map.nodes {
        *nodes
            .entry([node.kind.into(), node.reachability.into()])
            .or_default() += 1;
    }
    encode_counts(
        encoder,
        (
            "weft_cluster_nodes",
            "Registered nodes by kind and reachability.",
        ),
        ["kind", "reachability"],
        nodes,
    )?;
    let mut targets: HashMap<[&str; 1], i64> = HashMap::new();
    for target in &map.targets {
        *targets.entry([target.reachability.into()]).or_default() += 1;
    }
    encode_counts(
        encoder,
        (
            "weft_cluster_storage_targets",
            "Registered storage targets by reachability.",
        ),
        ["reachability"],
        targets,
    )?;
    let sums: [(&str, &str, i64); 3] = [
        (
            "weft_cluster_storage_capacity_bytes",
            "Bytes all storage targets may hold, as last reported.",
            map.targets.iter().map(|t| t.usage.total_bytes as i64).sum(),
        ),
        (
            "weft_cluster_storage_free_bytes",
            "Bytes free on all storage targets, as last reported.",
            map.targets.iter().map(|t| t.usage.free_bytes as i64).sum(),
        ),
        (
            "weft_cluster_client_sessions",
            "Client sessions that are alive.",
            map.live_sessions.len() as i64,
        ),
    ];
    for (name, help, value) in sums {
        let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        ConstGauge::new(value).encode(metric)?;
    }
    Ok(())
}

/// Each pool's targets by capacity class, and its space.
fn encode_pools(map: &ClusterMap, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let pools = map.all_pools();
    let mut classes: HashMap<[&str; 2], i64> = HashMap::new();
    for pool in &pools {
        for class in [
            CapacityClass::Normal,
            CapacityClass::Low,
            CapacityClass::Emergency,
        ] {
            let count = map
                .pool_targets(pool.id)
                .filter(|t| pool.class_of(&t.usage) == class)
                .count();
            classes.insert([pool.name.as_str(), class.into()], count as i64);
        }
    }
    encode_counts(
        encoder,
        (
            "weft_pool_targets",
            "Storage targets of each pool by capacity class (normal, low, emergency), by the \
             pool's limits.",
        ),
        ["pool", "class"],
        classes,
    )?;
    let columns: [weft_observe::metrics::Column<SpaceUsage>; 2] = [
        (
            "weft_pool_capacity_bytes",
            "Bytes the targets of each pool may hold, as last reported.",
            |usage| usage.total_bytes,
        ),
        (
            "weft_pool_free_bytes",
            "Bytes free on the targets of each pool, as last reported.",
            |usage| usage.free_bytes,
        ),
    ];
    for (name, help, value) in columns {
        let sums: HashMap<[&str; 1], i64> = pools
            .iter()
            .map(|pool| {
                let sum: u64 = map.pool_targets(pool.id).map(|t| value(&t.usage)).sum();
                ([pool.name.as_str()], sum as i64)
            })
            .collect();
        encode_counts(encoder, (name, help), ["pool"], sums)?;
    }
    Ok(())
}

/// Mirror groups' members by consistency, and each group's version.
fn encode_mirror_groups(
    map: &ClusterMap,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let mut members: HashMap<[&str; 2], i64> = HashMap::new();
    for group in &map.mirror_groups {
        for member in &group.members {
            *members
                .entry([group.kind.into(), member.state.into()])
                .or_default() += 1;
        }
    }
    encode_counts(
        encoder,
        (
            "weft_cluster_mirror_members",
            "Members of mirror groups by kind and consistency (good, needs-resync, bad).",
        ),
        ["kind", "state"],
        members,
    )?;
    let ids: Vec<String> = map.mirror_groups.iter().map(|g| g.id.to_string()).collect();
    let versions: HashMap<[&str; 2], i64> = map
        .mirror_groups
        .iter()
        .zip(&ids)
        .map(|(group, id)| ([group.kind.into(), id.as_str()], group.version.0 as i64))
        .collect();
    encode_counts(
        encoder,
        (
            "weft_cluster_mirror_group_version",
            "Each mirror group's version: it changes with every failover, drop or return.",
        ),
        ["kind", "group"],
        versions,
    )
}
