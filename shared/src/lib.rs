//! Terrace's core: what a job is and how it is validated, how terraform runs it in an isolated
//! workspace with its state served from a [`state_backends::StateStore`], how its log streams
//! and what its result says. It knows no cloud SDK and no trigger; the functions adapt their
//! queues and credentials to [`runner::Runner`].

pub mod backup;
pub mod classify;
pub mod client;
pub mod cost;
pub mod drift;
pub mod job;
pub mod leftovers;
pub mod lifecycle;
pub mod logs;
pub mod metrics;
pub mod pipeline;
pub mod process;
pub mod records;
pub mod recover;
pub mod redact;
pub mod result;
pub mod rollback;
pub mod runner;
pub mod settings;
pub mod state_server;
pub mod template;
pub mod tenants;
pub mod terraform;
pub mod trigger;
pub mod ui;
pub mod validate;
