//! `include/zenoh_cuda_shm.h` is what cbindgen makes of this crate's sources now.

#[test]
fn the_checked_in_header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("generate the header")
        .write(&mut fresh);
    let path = format!("{dir}/include/zenoh_cuda_shm.h");
    if std::env::var_os("ZCS_BLESS_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write the header");
        return;
    }
    let current = std::fs::read(&path).unwrap_or_default();
    assert!(
        current == fresh,
        "{path} is stale: regenerate it with `ZCS_BLESS_HEADER=1 cargo test -p zenoh-cuda-shm-c --test header`"
    );
}
