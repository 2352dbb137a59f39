//! Link settings of `libfaultmap.so`: its SONAME.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libfaultmap.so");
}
