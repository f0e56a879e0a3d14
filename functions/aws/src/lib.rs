//! `terrace-aws`: the AWS function. On Lambda (`AWS_LAMBDA_RUNTIME_API` set) it serves SQS
//! batches of jobs and EventBridge Scheduler events (the backup and drift sweeps). `terrace-aws task` is
//! the entry point of the ECS Fargate task a job too long for Lambda is handed to: it runs the
//! job staged in the customer's bucket that `TERRACE_JOB_REF` points to (or, run by hand, the job
//! message in `TERRACE_JOB`) with the same core.

pub mod access;
pub mod app;
pub mod broker;
pub mod config;
pub mod events;
pub mod transport;
