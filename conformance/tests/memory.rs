//! MemoryStore, the reference model, passes the whole suite.

dedup_conformance::suite!(dedup_conformance::MemoryFactory::default());
dedup_conformance::admin_suite!(dedup_conformance::MemoryFactory::default());
