//! `mlx5 counters`: the port counters and `hw_counters` of a device, once or sampled every
//! `-i` seconds with the deltas, as people watch sysfs.
//!
//! Sources:
//! * sysfs ([`read_sysfs`]): `$SYSFS_PATH/class/infiniband/DEV/ports/N/counters/*` and
//!   `.../hw_counters/*` (`SYSFS_PATH` defaults to `/sys`, as libibverbs reads it);
//! * the emulator (`--emu`, [`emu_sample`]): every counter the emulator's `Counters` has, found
//!   generically from its `Debug` form ([`parse_debug_counters`]) so that counters added to the
//!   emulator appear here without a change; those named like mlx5 `hw_counters` are grouped so.
//!   An in-process emulator has no traffic of its own: `--load send` runs `--ops` SENDs between
//!   two of its QPs before each later sample.
//!
//! A counter file that does not hold a number is an error naming the file; a file the kernel
//! refuses to read (an unsupported counter) is left out with a note.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mlx5_emu::Counters;

/// One counter value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    /// Where it comes from: `port1/counters`, `port1/hw_counters`, `hw_counters`, `device`.
    pub group: String,
    /// Its name (the sysfs file name, or the emulator's field name).
    pub name: String,
    /// Its value.
    pub value: u64,
}

/// One reading of every counter of a device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Counters in a stable order (group, then name as listed).
    pub counters: Vec<Counter>,
    /// Counters that could not be read (unsupported), with the reason.
    pub notes: Vec<String>,
}

impl Sample {
    /// The value of `name` in `group`.
    pub fn get(&self, group: &str, name: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|c| c.group == group && c.name == name)
            .map(|c| c.value)
    }
}

/// The sysfs root: `SYSFS_PATH` or `/sys`.
pub fn sysfs_root() -> PathBuf {
    std::env::var_os("SYSFS_PATH")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/sys"), PathBuf::from)
}

/// Sorted directory entries' names (numbers sort numerically).
fn list(dir: &Path) -> Result<Vec<String>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut v: Vec<String> = rd
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    v.sort_by(|a, b| match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        _ => a.cmp(b),
    });
    Ok(v)
}

/// The value in a counter file's text: one unsigned decimal number (sysfs writes a newline).
///
/// # Errors
/// Anything else, quoting (up to 40 characters of) what was found.
pub fn parse_value(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.parse::<u64>().map_err(|_| {
        let shown: String = t.chars().take(40).collect();
        if t.is_empty() {
            "empty: no counter value".to_owned()
        } else {
            format!("{shown:?} is not a counter value (an unsigned decimal number)")
        }
    })
}

/// Reads every file in `dir` as a counter into `s` under `group`.
fn read_group(s: &mut Sample, dir: &Path, group: &str) -> Result<(), String> {
    for name in list(dir)? {
        let p = dir.join(&name);
        // sysfs has no hidden files; a writer's temporary one (`.NAME.new`, the emulator's
        // preload) is no counter.
        if p.is_dir() || name.starts_with('.') {
            continue;
        }
        match std::fs::read(&p) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let value = parse_value(&text)
                    .map_err(|e| format!("{group}/{name} ({}): {e}", p.display()))?;
                s.counters.push(Counter {
                    group: group.to_owned(),
                    name,
                    value,
                });
            }
            // the kernel refuses counters the device does not support (EINVAL, EOPNOTSUPP)
            Err(e) => s.notes.push(format!("{group}/{name}: not readable ({e})")),
        }
    }
    Ok(())
}

/// The device to read: `dev`, or the first one under `class/infiniband`.
///
/// # Errors
/// No such device, or no device at all.
pub fn sysfs_device(root: &Path, dev: Option<&str>) -> Result<String, String> {
    let class = root.join("class/infiniband");
    let devs = list(&class).map_err(|e| format!("no RDMA devices in sysfs ({e})"))?;
    match dev {
        Some(d) if devs.iter().any(|x| x == d) => Ok(d.to_owned()),
        Some(d) => Err(format!(
            "no device {d:?} in {} (there are: {})",
            class.display(),
            if devs.is_empty() {
                "none".to_owned()
            } else {
                devs.join(", ")
            }
        )),
        None => devs
            .into_iter()
            .next()
            .ok_or_else(|| format!("no RDMA devices in {}", class.display())),
    }
}

/// One sample of device `dev`'s ports (all, or `port`) from the sysfs tree at `root`.
///
/// # Errors
/// The device or port is missing, or a counter file holds garbage (named).
pub fn read_sysfs(root: &Path, dev: &str, port: Option<u8>) -> Result<Sample, String> {
    let ports_dir = root.join("class/infiniband").join(dev).join("ports");
    let ports = list(&ports_dir)?;
    let ports: Vec<String> = match port {
        Some(p) => {
            let p = p.to_string();
            if !ports.contains(&p) {
                return Err(format!(
                    "{dev} has no port {p} (ports: {})",
                    ports.join(", ")
                ));
            }
            vec![p]
        }
        None => ports,
    };
    let mut s = Sample::default();
    for p in ports {
        let base = ports_dir.join(&p);
        let mut any = false;
        for group in ["counters", "hw_counters"] {
            let dir = base.join(group);
            if dir.is_dir() {
                any = true;
                read_group(&mut s, &dir, &format!("port{p}/{group}"))?;
            }
        }
        if !any {
            s.notes
                .push(format!("port {p}: no counters or hw_counters directory"));
        }
    }
    Ok(s)
}

/// Every `name: number` in a `Debug` rendering of a struct, nested structs as `outer.inner`,
/// arrays of numbers as `name[i]`; other values (bools, strings) are left out.
///
/// # Errors
/// Text that is not a `Debug` struct rendering.
pub fn parse_debug_counters(text: &str) -> Result<Vec<(String, u64)>, String> {
    let toks = tokenize(text);
    let mut out = Vec::new();
    let mut i = 0;
    // Skip the type name.
    if matches!(toks.first(), Some(Tok::Ident(_))) {
        i = 1;
    }
    if toks.get(i) != Some(&Tok::Open('{')) {
        return Err("not a Debug struct (no `{`)".into());
    }
    struct_body(&toks, &mut i, "", &mut out, 0)?;
    Ok(out)
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Num(u64),
    Open(char),
    Close(char),
    Colon,
    Comma,
    Other,
}

fn tokenize(text: &str) -> Vec<Tok> {
    let b: Vec<char> = text.chars().collect();
    let mut v = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let st = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            v.push(Tok::Ident(b[st..i].iter().collect()));
        } else if c.is_ascii_digit() {
            let st = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == '.' || b[i] == '_') {
                i += 1;
            }
            let t: String = b[st..i].iter().collect();
            v.push(t.parse::<u64>().map_or(Tok::Other, Tok::Num));
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            v.push(Tok::Other);
        } else {
            v.push(match c {
                '{' | '[' | '(' => Tok::Open(c),
                '}' | ']' | ')' => Tok::Close(c),
                ':' => Tok::Colon,
                ',' => Tok::Comma,
                _ => Tok::Other,
            });
            i += 1;
        }
    }
    v
}

/// Deepest nesting [`parse_debug_counters`] follows.
const MAX_DEPTH: usize = 16;

/// At `toks[*i] == Open('{')`: the fields up to the matching `}`.
fn struct_body(
    toks: &[Tok],
    i: &mut usize,
    prefix: &str,
    out: &mut Vec<(String, u64)>,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    *i += 1;
    loop {
        match toks.get(*i) {
            Some(Tok::Close('}')) => {
                *i += 1;
                return Ok(());
            }
            Some(Tok::Comma) => *i += 1,
            Some(Tok::Ident(name)) if toks.get(*i + 1) == Some(&Tok::Colon) => {
                let full = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}.{name}")
                };
                *i += 2;
                value(toks, i, &full, out, depth + 1)?;
            }
            // `..` of finish_non_exhaustive and anything else unexpected: skip a token
            Some(_) => *i += 1,
            None => return Err("unterminated Debug struct".into()),
        }
    }
}

/// One field value at `toks[*i]`.
fn value(
    toks: &[Tok],
    i: &mut usize,
    name: &str,
    out: &mut Vec<(String, u64)>,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    match toks.get(*i) {
        Some(Tok::Num(n)) => {
            out.push((name.to_owned(), *n));
            *i += 1;
        }
        Some(Tok::Ident(_)) if toks.get(*i + 1) == Some(&Tok::Open('{')) => {
            *i += 1;
            struct_body(toks, i, name, out, depth + 1)?;
        }
        Some(Tok::Open('[')) => {
            *i += 1;
            let mut k = 0;
            loop {
                match toks.get(*i) {
                    Some(Tok::Close(']')) => {
                        *i += 1;
                        break;
                    }
                    Some(Tok::Comma) => *i += 1,
                    Some(_) => {
                        value(toks, i, &format!("{name}[{k}]"), out, depth + 1)?;
                        k += 1;
                    }
                    None => return Err("unterminated array".into()),
                }
            }
        }
        Some(_) => {
            // skip one value: a bool, a string, a tuple struct ... up to the next `,` / `}`
            let mut depth = 0usize;
            while let Some(t) = toks.get(*i) {
                match t {
                    Tok::Open(_) => depth += 1,
                    Tok::Close(_) if depth == 0 => break,
                    Tok::Close(_) => depth -= 1,
                    Tok::Comma if depth == 0 => break,
                    _ => {}
                }
                *i += 1;
            }
        }
        None => return Err(format!("no value for {name}")),
    }
    Ok(())
}

/// A sample of the emulator's counters of one HCA: `hw_counters` (the mlx5 names), `link` (the
/// host-device link as PCIe would carry it) and `device` (every other counter the emulator
/// keeps).
pub fn emu_sample(c: &Counters) -> Sample {
    let mut s = Sample::default();
    let all = parse_debug_counters(&format!("{c:?}")).unwrap_or_default();
    for (name, value) in all {
        let group = if Counters::HW_COUNTER_NAMES.contains(&name.as_str()) {
            "hw_counters"
        } else if Counters::LINK_COUNTER_NAMES.contains(&name.as_str()) {
            "link"
        } else {
            "device"
        };
        s.counters.push(Counter {
            group: group.to_owned(),
            name,
            value,
        });
    }
    // hw_counters first, as sysfs lists them under the port
    s.counters.sort_by_key(|c| c.group != "hw_counters");
    s
}

/// The deltas from `prev` to `cur`: `(counter, delta)` for every counter of `cur` (a counter
/// missing from `prev` counts from 0; one that went down shows a negative delta).
pub fn deltas<'a>(prev: &Sample, cur: &'a Sample) -> Vec<(&'a Counter, i128)> {
    cur.counters
        .iter()
        .map(|c| {
            let p = prev.get(&c.group, &c.name).unwrap_or(0);
            (c, i128::from(c.value) - i128::from(p))
        })
        .collect()
}

fn width(s: &Sample) -> usize {
    s.counters
        .iter()
        .map(|c| c.group.len() + 1 + c.name.len())
        .max()
        .unwrap_or(0)
        .max(8)
}

/// The first sample: every counter (with `all`) or the non-zero ones.
pub fn render_values(title: &str, s: &Sample, all: bool) -> String {
    let w = width(s);
    let mut o = format!("{title}\n");
    let mut shown = 0;
    for c in &s.counters {
        if all || c.value != 0 {
            let _ = writeln!(
                o,
                "  {:w$}  {:>20}",
                format!("{}/{}", c.group, c.name),
                c.value
            );
            shown += 1;
        }
    }
    let hidden = s.counters.len() - shown;
    if hidden > 0 {
        let _ = writeln!(o, "  ({hidden} counters at 0 not shown; -a shows them)");
    }
    for n in &s.notes {
        let _ = writeln!(o, "  note: {n}");
    }
    o
}

/// A later sample: the counters that moved (every one with `all`), value, delta and rate.
pub fn render_deltas(title: &str, prev: &Sample, cur: &Sample, secs: f64, all: bool) -> String {
    let w = width(cur);
    let mut o = format!("{title}\n");
    let _ = writeln!(
        o,
        "  {:w$}  {:>20}  {:>14}  {:>14}",
        "counter", "value", "delta", "per second"
    );
    let mut moved = 0;
    for (c, d) in deltas(prev, cur) {
        if all || d != 0 {
            let rate = if secs > 0.0 {
                format!("{:.1}", d as f64 / secs)
            } else {
                "-".to_owned()
            };
            let _ = writeln!(
                o,
                "  {:w$}  {:>20}  {:>+14}  {:>14}",
                format!("{}/{}", c.group, c.name),
                c.value,
                d,
                rate
            );
            moved += 1;
        }
    }
    if moved == 0 {
        let _ = writeln!(o, "  (no counter changed)");
    }
    o
}

/// Where the samples come from.
enum Source {
    Sysfs {
        root: PathBuf,
        dev: String,
        port: Option<u8>,
    },
    Emu {
        pair: Box<crate::live::Pair>,
        load: bool,
        ops: u32,
    },
}

impl Source {
    fn sample(&self) -> Result<Sample, String> {
        match self {
            Self::Sysfs { root, dev, port } => read_sysfs(root, dev, *port),
            Self::Emu { pair, .. } => Ok(emu_sample(&pair.emulator().counters(0))),
        }
    }

    /// Work between two samples (the emulator's load).
    fn between(&mut self) -> Result<Option<String>, String> {
        match self {
            Self::Emu {
                pair,
                load: true,
                ops,
            } => {
                pair.sends(*ops, 64)?;
                Ok(Some(format!("load: {ops} SENDs of 64 bytes")))
            }
            _ => Ok(None),
        }
    }
}

/// `mlx5 counters`.
///
/// # Errors
/// A bad interval, no device, unreadable or garbled counters, a failing load.
pub fn command(a: &crate::cli::CountersArgs) -> Result<(), String> {
    let root = match a.emu_pid {
        Some(pid) => emu_pid_root(pid)?,
        None => sysfs_root(),
    };
    run(a, &root, &mut |s| print!("{s}"))
}

/// The emulated sysfs tree of process `pid`: the preload writes it in the temporary
/// directory as `mlx5-emu-sysfs.<pid>` (tools/preload/src/shim.rs) and keeps its
/// `ports/1/counters/` and `hw_counters/` current (tools/preload/src/counters.rs).
///
/// `pid` may also be that of `mlx5 emu run`, whose child is the program: the tree of the
/// first child that has one.
///
/// # Errors
/// No such tree (the process is not under the preload, has not opened a device yet, or
/// has exited), naming the path looked at.
pub fn emu_pid_root(pid: u32) -> Result<PathBuf, String> {
    let tree = |p: u32| std::env::temp_dir().join(format!("mlx5-emu-sysfs.{p}"));
    // A tree being written has no device yet.
    let ready = |r: &PathBuf| list(&r.join("class/infiniband")).is_ok_and(|v| !v.is_empty());
    let root = tree(pid);
    if !ready(&root) {
        // `mlx5 emu run` runs the program as its child: PID may be that of `mlx5 emu run`.
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(r) = children
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
            .map(tree)
            .find(ready)
        {
            return Ok(r);
        }
        return Err(format!(
            "--emu-pid {pid}: no emulated sysfs tree at {} (is process {pid} running under the emulator's preload, and has it opened a device?)",
            root.display()
        ));
    }
    Ok(root)
}

/// The command on the sysfs tree at `root`, its output going to `out` (one call per sample).
///
/// # Errors
/// As [`command`].
pub fn run(
    a: &crate::cli::CountersArgs,
    root: &Path,
    out: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let interval = a.interval.unwrap_or(1.0);
    if !(interval.is_finite() && (0.0..=86_400.0).contains(&interval)) {
        return Err(format!(
            "-i {interval}: the interval must be 0 to 86400 seconds"
        ));
    }
    let count = match (a.count, a.interval) {
        (Some(n), _) => n,
        (None, Some(_)) => u32::MAX,
        (None, None) => 1,
    };
    if count == 0 {
        return Err("-n 0: at least one sample".into());
    }
    // Without --emu, a machine with no RDMA device in sysfs gets the emulated one, as the other
    // commands do.
    let no_devices = !a.emu
        && a.emu_pid.is_none()
        && list(&root.join("class/infiniband")).map_or(true, |v| v.is_empty());
    if no_devices {
        out(&format!(
            "no RDMA device under {}: showing the emulated device (--emu; --load send gives it traffic)\n",
            root.join("class/infiniband").display()
        ));
    }
    let (mut src, name) = if a.emu || no_devices {
        let pair = Box::new(crate::live::Pair::new()?);
        // the link counters count only when asked for
        pair.emulator().count_link(true);
        let name = pair
            .emulator()
            .hca_info(0)
            .map_or_else(|| "mlx5_0".to_owned(), |h| h.name);
        if let Some(d) = &a.dev {
            if *d != name {
                return Err(format!("no emulated device {d:?} (it is {name})"));
            }
        }
        (
            Source::Emu {
                pair,
                load: a.load.is_some(),
                ops: a.ops,
            },
            format!("{name} (emulated)"),
        )
    } else {
        let root = root.to_path_buf();
        let dev = sysfs_device(&root, a.dev.as_deref())?;
        let name = format!(
            "{dev} ({})",
            root.join("class/infiniband").join(&dev).display()
        );
        (
            Source::Sysfs {
                root,
                dev,
                port: a.port,
            },
            name,
        )
    };
    let mut prev = src.sample()?;
    let mut t_prev = Instant::now();
    out(&render_values(&format!("{name}: sample 1"), &prev, a.all));
    for k in 2..=count {
        let load = src.between()?;
        let left = Duration::from_secs_f64(interval).saturating_sub(t_prev.elapsed());
        std::thread::sleep(left);
        let cur = src.sample()?;
        let secs = t_prev.elapsed().as_secs_f64();
        t_prev = Instant::now();
        let mut title = format!("{name}: sample {k}, {secs:.3} s after the previous one");
        if let Some(l) = load {
            title.push_str(&format!(" ({l})"));
        }
        out(&render_deltas(&title, &prev, &cur, secs, a.all));
        prev = cur;
    }
    Ok(())
}
