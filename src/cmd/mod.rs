//! One module per subcommand (or group of subcommands).

pub mod agent;
pub mod canon;
pub mod gateway;
pub mod record;
pub mod status;
pub mod verify;
