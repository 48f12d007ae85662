//! Waiting for SIGINT or SIGTERM.

use anyhow::Result;

/// Resolves at the first SIGINT or SIGTERM.
pub async fn terminated() -> Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    })
}
