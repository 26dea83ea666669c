//! Shutdown signals: the first SIGINT or SIGTERM starts a graceful shutdown (stop accepting, let running requests
//! finish up to the timeout); a second one cuts the wait short.

use std::time::Duration;

use tokio::sync::watch;

/// Resolves when SIGINT or SIGTERM arrives; returns the signal's name.
pub async fn signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            // Without handlers only Ctrl-C through tokio's portable API is left.
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        };
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    }
}

/// Watches for signals: `first` flips to true on the first one, `second` on the next.
pub struct Signals {
    pub first: watch::Receiver<bool>,
    pub second: watch::Receiver<bool>,
}

/// Spawns the signal watcher.
pub fn watch_signals(grace: Duration) -> Signals {
    let (first_tx, first) = watch::channel(false);
    let (second_tx, second) = watch::channel(false);
    tokio::spawn(async move {
        let name = signal().await;
        tracing::info!(
            "Received {name}: shutting down; running requests may finish within {:.0} s (send it again to stop now)",
            grace.as_secs_f64()
        );
        let _ = first_tx.send(true);
        let name = signal().await;
        tracing::warn!("Received {name} again: stopping now");
        let _ = second_tx.send(true);
    });
    Signals { first, second }
}

/// Resolves once the watched flag becomes true (never, if its sender is gone before that).
pub async fn flag(mut rx: watch::Receiver<bool>) {
    if rx.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}
