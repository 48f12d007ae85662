//! What a Weft process tells its operators, apart from its RPC (`weft_net`, which serves it):
//!
//! - [`metrics`] — what every server exports to Prometheus, and the per-client load table.
//! - [`http`] — HTTP on a service's port: `/metrics` and the service's own pages ([`Pages`]).
//! - [`influx`] — the optional push of the same metrics to InfluxDB.

pub mod http;
pub mod influx;
pub mod metrics;

pub use http::{HttpReply, Pages};
pub use metrics::{Metrics, MetricsBuilder};
