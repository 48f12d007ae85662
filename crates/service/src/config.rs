//! Typed configuration from a TOML file plus `key=value` overrides from the command line.
//!
//! The file and the overrides are merged into one TOML table and then deserialized into the
//! service's config struct, which uses `#[serde(deny_unknown_fields)]`: a misspelt key is an
//! error that names it, whether it came from the file or the command line.

use serde::de::DeserializeOwned;
use std::path::Path;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file or an override is not valid TOML, or names an unknown key or a wrong type.
    #[error("invalid configuration{origin}: {reason}")]
    Invalid {
        /// Where the bad value came from.
        origin: String,
        /// What is wrong, naming the key.
        reason: String,
    },
}

/// The problem report for a configured directory that does not exist, with the fix.
pub fn missing_directory(key: &str, path: &Path) -> String {
    format!(
        "{key} {} does not exist: create it (mkdir -p {}) or fix the path",
        path.display(),
        path.display()
    )
}

/// Loads a config: the file (if any), then each `key=value` override (dotted keys allowed).
///
/// # Errors
/// [`ConfigError`] naming the file or the key that is wrong.
pub fn load<T: DeserializeOwned>(
    file: Option<&Path>,
    overrides: &[(String, String)],
) -> Result<T, ConfigError> {
    let mut table = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.display().to_string(),
                source,
            })?;
            text.parse::<toml::Table>()
                .map_err(|error| ConfigError::Invalid {
                    origin: format!(" in {}", path.display()),
                    reason: error.to_string(),
                })?
        }
        None => toml::Table::new(),
    };
    for (key, value) in overrides {
        let parsed = parse_value(value);
        let mut slot = &mut table;
        let parts: Vec<&str> = key.split('.').collect();
        for part in &parts[..parts.len() - 1] {
            let entry = slot
                .entry(part.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            slot = entry.as_table_mut().ok_or_else(|| ConfigError::Invalid {
                origin: format!(" on the command line ({key})"),
                reason: format!("`{part}` is not a table"),
            })?;
        }
        slot.insert(parts[parts.len() - 1].to_string(), parsed);
    }
    let origin = file
        .map(|p| format!(" in {}", p.display()))
        .unwrap_or_default();
    T::deserialize(toml::Value::Table(table)).map_err(|error| ConfigError::Invalid {
        origin,
        reason: error.to_string().trim().to_string(),
    })
}

/// A command-line value is TOML if it parses as such (numbers, booleans, arrays), else a string.
fn parse_value(text: &str) -> toml::Value {
    format!("v = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut table| table.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Example {
        listen: String,
        #[serde(default)]
        threads: u32,
    }

    // Goal: overrides win over the file, and an unknown key is rejected with its name.
    #[test]
    fn overrides_and_unknown_keys() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("c.toml");
        std::fs::write(&path, "listen = \"a:1\"\nthreads = 2\n").expect("write");
        let loaded: Example = load(Some(&path), &[("threads".into(), "8".into())]).expect("load");
        assert_eq!(
            loaded,
            Example {
                listen: "a:1".into(),
                threads: 8
            }
        );
        let error = load::<Example>(Some(&path), &[("colour".into(), "red".into())])
            .expect_err("unknown key");
        assert!(error.to_string().contains("colour"), "{error}");
    }
}
