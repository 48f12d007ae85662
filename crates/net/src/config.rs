//! The keys every process's config shares, declared once and appended to its own keys at the
//! top level of the config file (so a misspelt key is still refused by `deny_unknown_fields`,
//! which serde does not support with a flattened struct):
//! - [`security_config!`](crate::security_config): the security keys, in every config, the
//!   client's (`weft mount`) included;
//! - [`service_config!`](crate::service_config): those, and the keys every server shares: the
//!   connection cap, logging and metrics.
//!
//! Durations are `*_ms` keys read into a [`std::time::Duration`] once, by
//! [`weft_proto::millis`].

/// The default of `connections_max`.
pub fn default_connections_max() -> usize {
    crate::CONNECTIONS_MAX_DEFAULT
}

/// Declares a config struct with the security keys appended after its own (see
/// [`crate::config`]), and gives it `auth_settings()`. Every field of the struct must be `pub`.
#[macro_export]
macro_rules! security_config {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident : $ty:ty
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$field_meta])* pub $field: $ty, )*
            /// The cluster key file (`weft keygen FILE`): every connection, made or accepted,
            /// proves it holds this key. Required unless `auth = "none"`.
            #[serde(default)]
            pub auth_key_file: Option<std::path::PathBuf>,
            /// `"none"` runs without authentication: any peer that reaches the port can read
            /// and change everything (logged as a warning at every start).
            #[serde(default)]
            pub auth: Option<$crate::AuthMode>,
            /// TLS for every connection this process makes and accepts: its certificate
            /// (PEM), signed by the cluster's CA. With `tls_key_file` and `tls_ca_file`;
            /// absent: plain TCP.
            #[serde(default)]
            pub tls_cert_file: Option<std::path::PathBuf>,
            /// The private key of `tls_cert_file` (PEM).
            #[serde(default)]
            pub tls_key_file: Option<std::path::PathBuf>,
            /// The cluster's CA certificate (PEM): peers must present a certificate it signed.
            #[serde(default)]
            pub tls_ca_file: Option<std::path::PathBuf>,
        }

        impl $name {
            /// The security keys of this config.
            pub fn auth_settings(&self) -> $crate::auth::AuthSettings<'_> {
                $crate::auth::AuthSettings {
                    mode: self.auth,
                    key_file: self.auth_key_file.as_deref(),
                    tls_cert_file: self.tls_cert_file.as_deref(),
                    tls_key_file: self.tls_key_file.as_deref(),
                    tls_ca_file: self.tls_ca_file.as_deref(),
                }
            }
        }
    };
}

/// Declares a service's config struct with the keys every service shares appended after its
/// own (see [`crate::config`]): the security keys ([`security_config!`](crate::security_config)),
/// the connection cap, logging and metrics; and gives it `admission()`, `auth_settings()` and
/// `shared_problems()`. Every field of the struct must be `pub`.
#[macro_export]
macro_rules! service_config {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident : $ty:ty
            ),* $(,)?
        }
    ) => {
        $crate::security_config! {
            $(#[$meta])*
            pub struct $name {
                $( $(#[$field_meta])* pub $field: $ty, )*
                /// Connections this service keeps open at most; beyond it new ones are closed
                /// at once (their peers retry). A quarter of them (at least 8) may be in their
                /// handshake at once.
                #[serde(default = "weft_net::config::default_connections_max")]
                pub connections_max: usize,
                /// Log filter: `info` (the default), `debug`, or per module, e.g.
                /// `info,weft_meta=debug`. `--log` and `WEFT_LOG` win over it.
                #[serde(default)]
                pub log: Option<String>,
                /// Also serve the metrics (and management's pages) over HTTP on this address,
                /// e.g. `127.0.0.1:9100`; they are always served on `listen` too.
                #[serde(default)]
                pub metrics_listen: Option<String>,
                /// Optional push of this service's metrics to InfluxDB (`[influxdb]`: `url`,
                /// `database`, `interval_ms`).
                #[serde(default)]
                pub influxdb: Option<$crate::observe::influx::InfluxConfig>,
            }
        }

        impl $name {
            /// What the service exports its metrics to besides its own port.
            pub fn exporters(&self) -> $crate::Exporters {
                $crate::Exporters {
                    influxdb: self.influxdb.clone(),
                    metrics_listen: self.metrics_listen.clone(),
                }
            }

            /// Who this service lets in, and how many at once.
            ///
            /// # Errors
            /// When the security keys contradict each other or a file is unusable.
            pub fn admission(&self) -> Result<$crate::Admission, String> {
                Ok($crate::Admission::new(
                    $crate::Auth::for_service(self.auth_settings())?,
                    self.connections_max,
                ))
            }

            /// Adds the problems of the shared keys to `problems`.
            pub fn shared_problems(&self, problems: &mut Vec<String>) {
                if self.connections_max < 16 {
                    problems.push(format!(
                        "connections_max = {} is below 16",
                        self.connections_max
                    ));
                }
                if let Some(influxdb) = &self.influxdb {
                    if let Err(problem) = influxdb.validate() {
                        problems.push(problem);
                    }
                }
            }
        }
    };
}
