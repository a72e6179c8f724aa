//! The `switchyard` binary: parse the command line, run it, exit with its status.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = switchyard::cli::Cli::parse();
    let code = switchyard::cli::run(cli).await?;
    std::process::exit(code);
}
