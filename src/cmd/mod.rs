//! One module per subcommand (or group of subcommands).

pub(crate) mod agent;
pub(crate) mod agent_admin;
pub(crate) mod bench_ingest;
pub(crate) mod bench_verify;
pub(crate) mod canon;
pub(crate) mod cosigner;
pub(crate) mod data_folder;
pub(crate) mod export;
pub(crate) mod gateway;
pub(crate) mod head;
pub(crate) mod keys;
pub(crate) mod monitor;
pub(crate) mod out;
pub(crate) mod project;
pub(crate) mod read_token;
pub(crate) mod record;
pub(crate) mod serve;
pub(crate) mod status;
pub(crate) mod store;
pub(crate) mod verify;
