//! The addon is a shared library that Node.js loads with dlopen: Node-API
//! symbols stay undefined until then (they are the node executable's), and
//! the OTEP 4947 slot must be in `.dynsym`, where readers look for it. The
//! slot is defined in assembly, so rustc's version script (which lists only
//! Rust's exports) would make it local; ours, merged with it, keeps it.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=exports.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/exports.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--allow-shlib-undefined");
}
