//! Gives this crate's tests and examples an rpath to the libssa that ssa-sys linked.
fn main() {
    if let Ok(dir) = std::env::var("DEP_SSA_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
