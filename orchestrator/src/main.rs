//! `orchard` command line (placeholder until the orchestrator issue): prints its version.

fn main() {
    println!("orchard {}", env!("CARGO_PKG_VERSION"));
}
