//! `usemem`: the checked anonymous-memory workload of the `compare` driver, as its own program
//! (see `bench::compare::usemem`). `compare` runs the same code as `compare __usemem`.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    bench::compare::usemem::main_with(&args)
}
