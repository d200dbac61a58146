//! `orchard-floor N`: spawns `true` N times, one after another, and prints each
//! spawn-and-wait in nanoseconds, one per line: the exec floor, measured by a process
//! of its own (see [`orchard_bench::host::spawn_floor_apart`]).

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("usage: orchard-floor N"))?;
    let mut out = String::new();
    for d in orchard_bench::host::spawn_floor(n)? {
        out.push_str(&format!("{}\n", d.as_nanos()));
    }
    print!("{out}");
    Ok(())
}
