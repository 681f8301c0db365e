//! Links libssa. The library directory is SSA_LIB_DIR, or by default the in-tree
//! CMake build directory `build` at the repository root (../../../build from here).
//! Dependents read it back as DEP_SSA_LIB_DIR (to set an rpath).
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=SSA_LIB_DIR");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dir = match env::var_os("SSA_LIB_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => manifest.join("../../../build"),
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    let found = ["libssa.so", "libssa.dylib", "libssa.a", "ssa.lib"]
        .iter()
        .any(|n| dir.join(n).exists());
    if !found {
        println!(
            "cargo:warning=libssa not found in {} (set SSA_LIB_DIR to the directory holding libssa.so)",
            dir.display()
        );
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=ssa");
    // Our own tests and doctests find the library without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    println!("cargo:lib_dir={}", dir.display());
}
