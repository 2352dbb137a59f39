//! `include/faultmap.h` is what cbindgen makes of `src/lib.rs` today: a
//! change to the API without a new header fails here. `FAULTMAP_BLESS=1`
//! writes the new header instead (not when `CI` is set).

use std::path::Path;

#[test]
fn the_header_in_the_repository_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not read src/lib.rs");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let path = dir.join("include/faultmap.h");
    // Only an explicit `FAULTMAP_BLESS=1`, and never in CI: CI must fail on
    // a stale header, not rewrite it.
    if std::env::var("FAULTMAP_BLESS").as_deref() == Ok("1") && std::env::var_os("CI").is_none() {
        std::fs::write(&path, &fresh).expect("writing include/faultmap.h");
        return;
    }
    let kept = std::fs::read(&path).unwrap_or_default();
    assert!(
        kept == fresh,
        "{} is stale: regenerate it with FAULTMAP_BLESS=1 cargo test -p faultmap-capi --test header",
        path.display()
    );
}
