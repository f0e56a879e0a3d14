//! `terraform-provider-testcloud`: a fake cloud for tests and demos.
//!
//! Resources (`testcloud_network`, `testcloud_cluster`) are JSON files below a
//! root folder, so tests can inspect and tamper with "cloud" state directly.
//! Speaks Terraform plugin protocol 6 through the `tf-provider` crate.

mod cluster;
mod diag;
mod faults;
mod interrupt;
mod network;
mod provider;
mod resource;
mod store;

use provider::TestCloudProvider;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    interrupt::listen()?;
    tf_provider::serve("testcloud", TestCloudProvider::default()).await
}
