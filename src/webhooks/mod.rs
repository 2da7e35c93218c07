//! Webhooks (extension X8): deliveries of a sheet's change feed to the URLs that subscribed.
//!
//! The subscriptions and their positions are the domain's (`actors::webhook`): every change to
//! them is a log record, applied deterministically, so a restart, a crash or a new leader
//! resumes from the last acknowledged position. This module is the server's side:
//!
//! - [`address`]: which URLs may be posted to, and the resolver every connection goes through
//!   (the check repeated on the resolved address at each connection).
//! - [`sign`]: secrets and Standard Webhooks signatures.
//! - [`client`]: one attempt over the network, TLS for `https` (no redirects, bounded in time
//!   and memory).
//! - [`delivery`]: the delivery thread: one task per active webhook, one message in flight
//!   each, bounded connections in total, retries with backoff, and the decisions to disable.
//!
//! The HTTP operations are `crate::routes::webhooks`.

pub mod address;
pub mod client;
pub mod delivery;
pub mod sign;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub use delivery::Deliveries;

use crate::config::ServeArgs;

/// Most webhooks one key may hold.
pub const MAX_PER_KEY: usize = 50;

/// How webhooks are checked and given up on (`serve` flags).
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// Receivers on loopback, private and other inward addresses are allowed.
    pub allow_private: bool,
    /// A webhook failing this long without one success is disabled (`failing`).
    pub disable_after: Duration,
    /// CA certificates trusted for `https` receivers besides the Mozilla roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// The share of one core (percent) deliveries may use while requests are served.
    pub cpu_percent: u8,
}

impl WebhookSettings {
    /// From the serve flags.
    pub fn from_args(args: &ServeArgs) -> Self {
        WebhookSettings {
            allow_private: args.webhook_allow_private,
            disable_after: Duration::from_secs(args.webhook_disable_after_secs),
            ca_file: args.webhook_ca_file.clone(),
            cpu_percent: args.webhook_cpu_percent,
        }
    }
}

/// Counters of the delivery side, for metrics.
#[derive(Debug, Default)]
pub struct DeliveryMetrics {
    /// Messages acknowledged by a 2xx.
    pub delivered: AtomicU64,
    /// Changes in those messages.
    pub changes_delivered: AtomicU64,
    /// Attempts that failed.
    pub failed: AtomicU64,
    /// Microseconds deliveries waited for their CPU budget while requests were served.
    pub paced_micros: AtomicU64,
}
