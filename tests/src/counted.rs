//! A bucket that counts the calls made to it, for cost checks against any cloud's emulator.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use state_backends::Result;
use state_backends::objects::{Bucket, Condition, Listed, Object};

/// Wraps a bucket; every call adds one to the shared counter.
#[derive(Clone, Debug)]
pub struct Counted<B> {
    inner: B,
    calls: Arc<AtomicUsize>,
}

impl<B> Counted<B> {
    pub fn new(inner: B, calls: Arc<AtomicUsize>) -> Self {
        Self { inner, calls }
    }

    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl<B: Bucket> Bucket for Counted<B> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn get(&self, key: &str) -> Result<Option<Object>> {
        self.tick();
        self.inner.get(key).await
    }
    async fn head(&self, key: &str) -> Result<Option<HashMap<String, String>>> {
        self.tick();
        self.inner.head(key).await
    }
    async fn put_tagged(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> Result<Option<Option<String>>> {
        self.tick();
        self.inner.put_tagged(key, data, metadata, condition).await
    }
    async fn copy(
        &self,
        from: &str,
        to: &str,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<()> {
        self.tick();
        self.inner.copy(from, to, metadata).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        self.tick();
        self.inner.delete(key).await
    }
    fn deletes_per_request(&self) -> usize {
        self.inner.deletes_per_request()
    }
    async fn delete_many(&self, keys: &[String]) -> Result<()> {
        let requests = keys.len().div_ceil(self.inner.deletes_per_request());
        self.calls.fetch_add(requests, Ordering::Relaxed);
        self.inner.delete_many(keys).await
    }
    fn empty_lock_object_is_unrecorded(&self) -> bool {
        self.inner.empty_lock_object_is_unrecorded()
    }
    async fn unlock(&self, key: &str) -> Result<()> {
        self.tick();
        self.inner.unlock(key).await
    }
    async fn clear_if(&self, key: &str, tag: &str) -> Result<()> {
        self.tick();
        self.inner.clear_if(key, tag).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.tick();
        self.inner.list(prefix).await
    }
    async fn folders(&self, prefix: &str) -> Result<Vec<String>> {
        self.tick();
        self.inner.folders(prefix).await
    }
}
