//! One module per subcommand (or group of subcommands).

pub(crate) mod agent;
pub(crate) mod agent_admin;
pub(crate) mod agent_args;
pub(crate) mod canon;
pub(crate) mod cosigner;
pub(crate) mod data_folder;
pub(crate) mod disclose;
pub(crate) mod export;
pub(crate) mod gateway;
pub(crate) mod head;
pub(crate) mod keys;
pub(crate) mod monitor;
pub(crate) mod out;
pub(crate) mod project;
pub(crate) mod read_token;
pub(crate) mod record;
pub(crate) mod report;
pub(crate) mod serve;
pub(crate) mod status;
pub(crate) mod store;
pub(crate) mod tools;
pub(crate) mod verify;

/// The log of `tally serve` and `tally cosigner serve` on stderr, filtered
/// by `RUST_LOG` (default `info`), with the libraries' lines rate-limited
/// (docs/operations.md "Logs").
pub(crate) fn init_server_logs() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let env = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_filter(tally_witness::log_filter::RateLimitedLibraries::new(env)),
        )
        .try_init();
}
