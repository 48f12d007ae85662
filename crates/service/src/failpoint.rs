//! Fault-injection points. A point named in the `WEFT_FAILPOINTS` environment variable
//! (comma-separated; `name@N` for the N-th time it is reached) ends the process right there,
//! as a crash would; tests set it to kill a
//! server at each step of a multi-step protocol. A few points instead make a server misbehave
//! in a way no crash shows ([`misbehave`]). Without the variable a point costs one load of a
//! cached empty list.

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

/// Whether the point `name` is armed: the caller then misbehaves as the point's name says,
/// so that a test sees its peers notice.
pub fn misbehave(name: &str) -> bool {
    armed().iter().any(|point| point == name)
}

/// Ends the process (exit status 86) if the point `name` is armed: at once, or, armed as
/// `name@N`, the N-th time it is reached.
pub fn failpoint(name: &str) {
    let armed = armed();
    if armed.is_empty() {
        return;
    }
    let reached = armed.iter().any(|point| match point.split_once('@') {
        None => point == name,
        Some((point, times)) => point == name && times.parse().is_ok_and(|n: u64| count(name) >= n),
    });
    if reached {
        eprintln!("weft: fault injection point {name} reached; exiting as a crash would");
        std::process::exit(86);
    }
}

/// How many times the point `name` was reached, this time included.
fn count(name: &str) -> u64 {
    static COUNTS: std::sync::Mutex<Vec<(String, u64)>> = std::sync::Mutex::new(Vec::new());
    let mut counts = COUNTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match counts.iter_mut().find(|(point, _)| point == name) {
        Some((_, times)) => {
            *times += 1;
            *times
        }
        None => {
            counts.push((name.to_string(), 1));
            1
        }
    }
}
