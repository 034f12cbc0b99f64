//! Compiles the C DLPack consumer/producer the tensor tests call through the C ABI.

fn main() {
    println!("cargo:rerun-if-changed=c/consume_dlpack.c");
    cc::Build::new()
        .file("c/consume_dlpack.c")
        .std("c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("zcs_consume_dlpack");
}
