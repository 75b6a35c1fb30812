//! `mlx5 --help`: the one-line summary names every subcommand the tool has, so a newcomer
//! reading only the first line learns that diag, counters, trace and tune exist.

use std::process::Command;

#[test]
fn the_summary_names_every_subcommand() {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx5"))
        .arg("--help")
        .output()
        .expect("run the mlx5 binary");
    assert!(out.status.success(), "{}", out.status);
    let text = String::from_utf8(out.stdout).expect("UTF-8 help");
    let (summary, rest) = text.split_once("\n\n").expect("a summary paragraph");
    let commands: Vec<&str> = rest
        .split("Commands:")
        .nth(1)
        .expect("a Commands section")
        .lines()
        .skip(1)
        .map_while(|l| l.strip_prefix("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 11, "{commands:?}");
    for c in ["diag", "counters", "trace", "tune", "emu", "lat", "bw"] {
        assert!(commands.contains(&c), "{c} in {commands:?}");
    }
    let words: Vec<String> = summary
        .split(|ch: char| !ch.is_ascii_alphanumeric())
        .map(str::to_owned)
        .collect();
    for c in &commands {
        assert!(
            words.iter().any(|w| w == c),
            "the summary does not name `{c}`:\n{summary}"
        );
    }
}
