//! The `switchyard` binary: parse the command line, run it, exit with its status.

use clap::Parser;

/// The request path makes many small, short-lived allocations from many threads, which
/// mimalloc's thread-local free lists make cheaper than glibc's malloc. Built without transparent
/// huge pages, which inflate the resident memory of many open streams.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let code = switchyard::cli::main(switchyard::cli::Cli::parse());
    // The log's gathered request lines, before the process ends (exit runs no destructors).
    switchyard_observe::log::sink::flush();
    std::process::exit(code?);
}
