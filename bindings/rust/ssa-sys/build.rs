//! Links libssa: statically by default (libssa.a, with the dependencies that
//! `pkg-config --static --libs ssa` names), or as the shared libssa.so with the
//! `dynamic` feature (with an rpath to it, so programs run without
//! LD_LIBRARY_PATH). The library directory is SSA_LIB_DIR, or by default the
//! in-tree CMake build directory `build` at the repository root
//! (../../../build from here); an installed lib directory works too (its
//! pkgconfig/ssa.pc is used). Dependents read it back as DEP_SSA_LIB_DIR.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn lib_dir() -> PathBuf {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dir = match env::var_os("SSA_LIB_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => manifest.join("../../../build"),
    };
    dir.canonicalize().unwrap_or(dir)
}

/// The libraries libssa.a needs, from ssa-uninstalled.pc (a build folder) or
/// pkgconfig/ssa.pc (an installed lib directory).
fn static_deps(dir: &Path) {
    let mut path = vec![dir.to_path_buf(), dir.join("pkgconfig")];
    if let Some(old) = env::var_os("PKG_CONFIG_PATH") {
        path.extend(env::split_paths(&old));
    }
    let out = Command::new("pkg-config")
        .args(["--static", "--libs", "ssa"])
        .env("PKG_CONFIG_PATH", env::join_paths(path).expect("PKG_CONFIG_PATH"))
        .output();
    let out = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => panic!(
            "pkg-config --static --libs ssa failed for {}: {}",
            dir.display(),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("cannot run pkg-config (needed to link libssa.a's dependencies): {e}"),
    };
    for flag in out.split_whitespace() {
        if let Some(p) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={p}");
        } else if let Some(l) = flag.strip_prefix("-l") {
            if l != "ssa" {
                println!("cargo:rustc-link-lib={l}");
            }
        } else if flag == "-pthread" {
            println!("cargo:rustc-link-arg=-pthread");
        }
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=SSA_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let dir = lib_dir();
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:lib_dir={}", dir.display());
    if env::var_os("CARGO_FEATURE_DYNAMIC").is_some() {
        if !["libssa.so", "libssa.dylib"].iter().any(|n| dir.join(n).exists()) {
            println!(
                "cargo:warning=no libssa.so in {} (set SSA_LIB_DIR to the directory holding it)",
                dir.display()
            );
        }
        println!("cargo:rustc-link-lib=dylib=ssa");
        // Programs find the library without LD_LIBRARY_PATH.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        return;
    }
    let archive = dir.join("libssa.a");
    if !archive.exists() {
        panic!(
            "no libssa.a in {} (build libssa with CMake first, or set SSA_LIB_DIR to the \
             directory holding libssa.a; the `dynamic` feature links libssa.so instead)",
            dir.display()
        );
    }
    println!("cargo:rerun-if-changed={}", archive.display());
    println!("cargo:rustc-link-lib=static=ssa");
    static_deps(&dir);
}
