//! The store `conformance/GUIDE.md` walks through, in a crate the `dedup` facade does not
//! know. Its URL is `example:NAME`: the in-process store called `NAME`, made on its
//! first open. Every later open of the same name is a second handle on the same records.
//! The records are kept by [`MemoryStore`](dedup_core::MemoryStore).
//!
//! A program registers it once, at start-up, then opens it by URL:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! dedup::register(&dedup_example_store::DESCRIPTOR)?;
//! let store = dedup::open("example:billing").await?;
//! let key = dedup::Key::new("billing", "order-42")?;
//! assert!(store.claim(&key, &Default::default()).await?.is_acquired());
//! # Ok(())
//! # }
//! ```

mod stores;
mod url;

pub use url::{DESCRIPTOR, ExampleTarget};
