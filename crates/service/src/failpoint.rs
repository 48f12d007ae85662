//! Fault-injection points. A point named in the `WEFT_FAILPOINTS` environment variable
//! (comma-separated) ends the process right there, as a crash would; tests set it to kill a
//! server at each step of a multi-step protocol. Without the variable a point costs one load
//! of a cached empty list.

use std::sync::OnceLock;

/// The environment variable that arms fault-injection points.
pub const FAILPOINTS_ENV: &str = "WEFT_FAILPOINTS";

fn armed() -> &'static [String] {
    static ARMED: OnceLock<Vec<String>> = OnceLock::new();
    ARMED.get_or_init(|| {
        std::env::var(FAILPOINTS_ENV)
            .map(|value| {
                value
                    .split(',')
                    .map(|p| p.trim().to_string())
                    .filter(|p| !p.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Ends the process (exit status 86) if the point `name` is armed.
pub fn failpoint(name: &str) {
    if armed().iter().any(|point| point == name) {
        eprintln!("weft: fault injection point {name} reached; exiting as a crash would");
        std::process::exit(86);
    }
}
