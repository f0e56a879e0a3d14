//! Terrace's core: what a job is and how it is validated, how terraform runs it in an isolated
//! workspace with its state served from a [`state_backends::StateStore`], how its log streams
//! and what its result says. It knows no cloud SDK and no trigger; the functions adapt their
//! queues and credentials to [`host::pipeline`] and [`run::runner::Runner`].
//!
//! Four layers, each a folder, each using only those below it:
//! [`host`] → [`sweeps`] → [`run`] → [`job`].

pub mod host;
pub mod job;
pub mod run;
pub mod sweeps;
