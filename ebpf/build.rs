//! Rebuild the programs when the linker changes (a new bpf-linker can change the object).
fn main() {
    println!("cargo:rerun-if-env-changed=PATH");
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
