//! What runs on a schedule over a customer's whole bucket: the hourly backups ([`backup`]) with
//! the deletion of expired plans ([`plans`]), and the drift checks ([`drift`]) it queues as
//! jobs.
//!
//! Uses [`crate::run`] and [`crate::job`]; knows nothing of triggers.

pub mod backup;
pub mod drift;
pub mod plans;
pub mod report;
