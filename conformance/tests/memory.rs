//! MemoryStore, the reference model, passes the whole suite.

dedup_conformance::suite!(dedup_conformance::MemoryFactory::default());
