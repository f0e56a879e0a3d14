//! What hosts the runner in a function or on a machine: one message's way from a queue to a
//! result ([`pipeline`], over the [`pipeline::Trigger`]s the functions implement), the tenant
//! registry ([`tenants`]), the settings from the environment ([`settings`]) and the process's
//! own setup and telemetry ([`process`]), a job's credential broker on loopback ([`broker`]), and the sweeps as a function runs them ([`sweep`]).
//!
//! The top layer: uses [`crate::sweeps`], [`crate::run`] and [`crate::job`].

pub mod broker;
pub mod message;
pub mod pipeline;
pub mod process;
pub mod settings;
pub mod sweep;
pub mod tenants;
pub mod trigger;
