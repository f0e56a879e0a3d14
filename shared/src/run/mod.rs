//! Running one job: the runner ([`runner::Runner`]) and what it works with. Terraform as a
//! child process ([`terraform`], [`client`], [`ui`]), the state server it talks to
//! ([`state_server`]), the job's log ([`logs`]), what a failure means and how it is recovered
//! ([`classify`], [`recover`], [`rollback`]), the records a run keeps ([`records`],
//! [`lifecycle`], [`result`]), its cost ([`cost`]) and metrics ([`metrics`]), and what a job
//! leaves running ([`leftovers`]).
//!
//! Uses [`crate::job`]; knows nothing of triggers, queues or sweeps.

pub mod classify;
pub mod client;
pub mod cost;
pub mod leftovers;
pub mod lifecycle;
pub mod logs;
pub mod metrics;
pub mod plans;
pub mod policy;
pub mod records;
pub mod recover;
pub mod result;
pub mod retry;
pub mod rollback;
pub mod runner;
pub mod sealed_outputs;
pub mod state_server;
pub mod terraform;
pub mod ui;
pub mod vouched;
