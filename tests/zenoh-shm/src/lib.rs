//! Nothing here: the package exists for `tests/shm_out.rs`, built apart from the router
//! plugin (see its manifest).
