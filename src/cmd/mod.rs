//! One module per subcommand (or group of subcommands).

pub mod agent;
pub mod agent_admin;
pub mod bench_ingest;
pub mod bench_verify;
pub mod canon;
pub mod cosigner;
pub mod data_folder;
pub mod export;
pub mod gateway;
pub mod head;
pub mod keys;
pub mod monitor;
pub mod out;
pub mod project;
pub mod read_token;
pub mod record;
pub mod serve;
pub mod status;
pub mod store;
pub mod verify;
