//! `mlx5`: devices, info, lat, bw, pingpong, emu and decode subcommands.
#![forbid(unsafe_code)]

use clap::Parser;

fn main() {
    let cli = mlx5_tools::cli::Cli::parse();
    if let Err(e) = mlx5_tools::app::run(cli.cmd) {
        eprintln!("mlx5: {e}");
        std::process::exit(1);
    }
}
