//! Link settings of `libfaultmap.so`: its SONAME, and no symbols of the
//! Rust libraries it is linked from (`--exclude-libs=ALL`): without it the
//! library would also export the `#[no_mangle]` functions of a dependency
//! (`crc-fast`'s `crc_fast_*`, through `object_store`), which could clash
//! with another library's. `scripts/c-tests` checks that only `fm_*` is
//! exported.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libfaultmap.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs=ALL");
}
