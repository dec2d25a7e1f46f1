//! Choosing the store by configuration: every program takes `--store URL` and opens it
//! with [`dedup::open`] (see the `dedup` crate for the URL forms and their parameters).
//! Each backend is behind a cargo feature of this crate (all on by default).

use std::path::Path;

/// The store URL an example program uses: its `--store` argument when given, else an SQLite
/// file named `file` in `dir` (a temporary folder the program owns: the embedded default).
pub fn url_or_temp_sqlite(store: Option<String>, dir: &Path, file: &str) -> String {
    store.unwrap_or_else(|| format!("sqlite:{}", dir.join(file).display()))
}
