//! `compare`: the same workloads under uffd-daemon's tier setups and under the kernel's own
//! swap (swap file, zswap, zram with a cgroup v1 limit), side by side in one run.
//! See `bench::compare` and docs/kernel-comparison.md.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    bench::compare::main_with(&args)
}
