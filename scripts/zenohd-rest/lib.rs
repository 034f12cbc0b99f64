//! Nothing of its own: this package exists so that `cargo build` compiles
//! `zenoh-plugin-rest` (a cdylib) with the zenoh features scripts/zenohd.sh passes.
