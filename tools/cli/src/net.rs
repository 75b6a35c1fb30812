//! `mlx5 emu net up|down`: the emulated Ethernet port as a Linux interface. `up` creates a
//! network namespace with a TAP interface inside (addresses in `docs/raw-ethernet.md`);
//! an emulated program started with `MLX5_EMU_TAP=<netns>/<ifname>` attaches its HCA 0's
//! port to it. `down` removes the namespace and the interface. Both need `CAP_NET_ADMIN`
//! and say so by name without it.

use clap::{Args, Subcommand};

/// `mlx5 emu net ...`.
#[derive(Debug, Args)]
pub struct NetArgs {
    #[command(subcommand)]
    pub what: NetWhat,
}

/// What to do with the namespace.
#[derive(Debug, Subcommand)]
pub enum NetWhat {
    /// Create the namespace and its TAP interface.
    Up(NetNames),
    /// Remove them.
    Down(NetNames),
}

/// The namespace and interface names.
#[derive(Debug, Args)]
pub struct NetNames {
    /// Network namespace name.
    #[arg(long, default_value = "mlx5emu")]
    pub netns: String,
    /// TAP interface name inside it.
    #[arg(long, default_value = "mlx5tap0")]
    pub ifname: String,
}

/// Run `mlx5 emu net up|down`.
pub fn command(a: &NetArgs) -> Result<(), String> {
    match &a.what {
        NetWhat::Up(n) => {
            mlx5_emu::net_up(&n.netns, &n.ifname)?;
            let h = mlx5_emu::NS_HOST_IP;
            println!(
                "network namespace {} with TAP {}: host {}.{}.{}.{}/16, emulated HCA of node N at 10.77.0.N",
                n.netns, n.ifname, h[0], h[1], h[2], h[3]
            );
            println!(
                "run programs with MLX5_EMU_TAP={}/{} MLX5_EMU_LINK_LAYER=eth",
                n.netns, n.ifname
            );
            Ok(())
        }
        NetWhat::Down(n) => mlx5_emu::net_down(&n.netns),
    }
}
