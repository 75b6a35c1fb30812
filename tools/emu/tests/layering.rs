//! The emulator's rooms import one way (`docs/architecture.md`, "The emulator's layering").
//!
//! Reads every source file of the crate, resolves each `crate::`, `super::` and `self::` path
//! (use trees expanded, inline modules followed) to the file that defines the module it names,
//! and checks, on the graph of rooms (a top-level file, or a top-level folder with the file of
//! the same name: `mem.rs` + `mem/`):
//! - nothing but the crate root names an item of the root (`crate::Emulator`, `crate::{a, b}`
//!   of root items): the root is the face, and everything below it stands on its own;
//! - the rooms form no circle;
//! - the rules the design rests on: the device never imports the kernel, the state below
//!   both (`model/`) imports neither them nor the world, and the world (`state.rs`) neither
//!   the device nor the kernel.
//!
//! The checker itself is tested on forged trees: a circle through a use group, through an
//! inline module's `super::`, through a root item, and a clean tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file: its module path (`[]` = the crate root) and its text.
struct Source {
    module: Vec<String>,
    text: String,
}

/// A reference from one file to another: the file named and the first path that named it.
type Edges = BTreeMap<(String, String), String>;

fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<String, Source>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p
                .strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            let mut module: Vec<String> = rel
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_owned)
                .collect();
            if matches!(module.last().map(String::as_str), Some("lib" | "mod")) {
                module.pop();
            }
            let text = std::fs::read_to_string(&p).expect("source is UTF-8");
            out.insert(rel, Source { module, text });
        }
    }
}

/// The text with comments, string and character literals blanked (lifetimes kept).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(b' ');
        } else if c == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) && {
            let prev = i.checked_sub(1).map(|k| b[k]);
            !prev.is_some_and(|p| p.is_ascii_alphanumeric() || p == b'_')
        } {
            // A raw string r"..." / r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"'
                    && b[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == b'#')
                        .count()
                        == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.extend_from_slice(b"\"\"");
            i = j;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.extend_from_slice(b"\"\"");
        } else if c == b'\'' {
            // '\x', '\u{..}', 'c' are characters; 'a (no closing quote after one char) a lifetime.
            if b.get(i + 1) == Some(&b'\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
                i = j + 1;
                out.extend_from_slice(b"' '");
            } else if let Some(len) =
                char_len(&b[i + 1..]).filter(|&l| b.get(i + 1 + l) == Some(&b'\''))
            {
                i += len + 2;
                out.extend_from_slice(b"' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).expect("stripping keeps UTF-8")
}

/// The length of the UTF-8 character `b` starts with (None: not a character there).
fn char_len(b: &[u8]) -> Option<usize> {
    (1..=4.min(b.len())).find(|&l| std::str::from_utf8(&b[..l]).is_ok())
}

/// Split `s` at top-level commas (outside braces).
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (k, ch) in s.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// The paths of a use tree: `a::{b, c::{d as e, self}}` -> `a::b`, `a::c::d`, `a::c`.
fn expand(tree: &str) -> Vec<String> {
    let t: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let t = t.trim();
    if let Some(open) = t.find('{') {
        let prefix = t[..open].trim_end_matches("::").replace(' ', "");
        let inner = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
        let mut out = Vec::new();
        for part in split_top(inner) {
            for p in expand(part) {
                out.push(match (prefix.is_empty(), p.as_str()) {
                    (true, _) => p.clone(),
                    (false, "self") => prefix.clone(),
                    (false, _) => format!("{prefix}::{p}"),
                });
            }
        }
        return out;
    }
    let t = t.split(" as ").next().unwrap_or(t);
    vec![t.replace(' ', "")]
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Every `crate::`/`super::`/`self::` path of a stripped file, with the module it is
/// written in (the file's module plus the inline modules around it).
fn paths(text: &str, module: &[String]) -> Vec<(Vec<String>, String)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut inline: Vec<(String, i32)> = Vec::new();
    let mut depth = 0i32;
    let mut i = 0;
    let here = |inline: &[(String, i32)]| -> Vec<String> {
        let mut m = module.to_vec();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    while i < b.len() {
        let c = b[i];
        if !c.is_ascii() {
            i += 1;
            continue;
        }
        let word_start = i == 0 || !is_ident(b[i - 1]);
        if c == b'{' {
            depth += 1;
            i += 1;
        } else if c == b'}' {
            depth -= 1;
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
            i += 1;
        } else if word_start && text[i..].starts_with("mod ") {
            // `mod name {` opens an inline module; `mod name;` declares a file (no edge).
            let rest = &text[i + 4..];
            let name: String = rest
                .trim_start()
                .bytes()
                .take_while(|&x| is_ident(x))
                .map(char::from)
                .collect();
            let after = rest.trim_start()[name.len()..].trim_start();
            if !name.is_empty() && after.starts_with('{') {
                inline.push((name, depth));
            }
            i += 4;
        } else if word_start && text[i..].starts_with("use ") {
            let end = text[i..].find(';').map_or(b.len(), |e| i + e);
            for p in expand(&text[i + 4..end]) {
                out.push((here(&inline), p));
            }
            i = end;
        } else if word_start
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|k| text[i..].starts_with(k))
        {
            let mut j = i;
            while j < b.len() && (is_ident(b[j]) || text[j..].starts_with("::")) {
                j += if b[j] == b':' { 2 } else { 1 };
            }
            out.push((here(&inline), text[i..j].trim_end_matches("::").to_owned()));
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// The file that defines the module a path names (the longest module prefix), and whether
/// the path goes on to an item of that module.
fn resolve(
    path: &str,
    at: &[String],
    files: &BTreeMap<Vec<String>, String>,
) -> Option<(String, bool)> {
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let (mut cur, mut rest): (Vec<String>, &[&str]) = match *segs.first()? {
        "crate" => (Vec::new(), &segs[1..]),
        "self" => (at.to_vec(), &segs[1..]),
        "super" => {
            let mut m = at.to_vec();
            let mut r = &segs[..];
            while r.first() == Some(&"super") {
                m.pop();
                r = &r[1..];
            }
            (m, r)
        }
        _ => return None,
    };
    // An inline module has no file: the innermost enclosing file module defines it.
    while !cur.is_empty() && !files.contains_key(&cur) {
        cur.pop();
        rest = &[];
    }
    while let Some(s) = rest.first() {
        let mut next = cur.clone();
        next.push((*s).to_owned());
        if !files.contains_key(&next) {
            break;
        }
        cur = next;
        rest = &rest[1..];
    }
    let item = rest.first().is_some_and(|s| *s != "*" && *s != "self");
    files
        .get(&cur)
        .map(|f| (f.clone(), item || rest.first() == Some(&"*")))
}

/// A file's room: its first path component without `.rs` (`mem.rs` and `mem/x.rs`: `mem`).
fn room(file: &str) -> String {
    let first = file.split('/').next().unwrap_or(file);
    first.trim_end_matches(".rs").to_owned()
}

/// What the checks found: one line per problem.
fn check(src_dir: &Path) -> Vec<String> {
    let mut sources = BTreeMap::new();
    collect(src_dir, src_dir, &mut sources);
    let files: BTreeMap<Vec<String>, String> = sources
        .iter()
        .map(|(f, s)| (s.module.clone(), f.clone()))
        .collect();
    let mut edges: Edges = BTreeMap::new();
    let mut problems = Vec::new();
    for (file, s) in &sources {
        for (at, p) in paths(&strip(&s.text), &s.module) {
            let Some((target, item)) = resolve(&p, &at, &files) else {
                continue;
            };
            if target == "lib.rs" && file != "lib.rs" && item {
                problems.push(format!("{file} names `{p}`, an item of the crate root"));
            }
            let (a, b) = (room(file), room(&target));
            if a != b && target != "lib.rs" {
                edges
                    .entry((a, b))
                    .or_insert_with(|| format!("{file}: `{p}`"));
            }
        }
    }
    problems.extend(circle(&edges));
    let never: &[(&str, &str, &str)] = &[
        (
            "device",
            "kernel",
            "the device reaches the kernel only through `state::KernelHooks`",
        ),
        ("model", "device", "the state below both imports neither"),
        ("model", "kernel", "the state below both imports neither"),
        (
            "model",
            "state",
            "the parts stand below the world that holds them",
        ),
        ("state", "device", "the world stands below the device"),
        ("state", "kernel", "the world stands below the kernel"),
    ];
    for (a, b, why) in never {
        if let Some(by) = edges.get(&((*a).to_owned(), (*b).to_owned())) {
            problems.push(format!("{a} -> {b} ({why}): {by}"));
        }
    }
    problems
}

/// A circle of rooms, as lines (`a -> b: by`), if there is one.
fn circle(edges: &Edges) -> Vec<String> {
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        adj.entry(a).or_default().push(b);
    }
    // Depth-first search; a back edge closes a circle.
    fn visit<'a>(
        v: &'a str,
        adj: &BTreeMap<&'a str, Vec<&'a str>>,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<&'a str>> {
        state.insert(v, 1);
        stack.push(v);
        for &w in adj.get(v).into_iter().flatten() {
            match state.get(w) {
                Some(1) => {
                    let k = stack.iter().position(|&x| x == w).expect("on the stack");
                    let mut c = stack[k..].to_vec();
                    c.push(w);
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(w, adj, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(v, 2);
        None
    }
    let mut state = BTreeMap::new();
    let starts: BTreeSet<&str> = adj.keys().copied().collect();
    for v in starts {
        if state.contains_key(v) {
            continue;
        }
        if let Some(c) = visit(v, &adj, &mut state, &mut Vec::new()) {
            return c
                .windows(2)
                .map(|p| {
                    let by = &edges[&(p[0].to_owned(), p[1].to_owned())];
                    format!("circle: {} -> {} ({by})", p[0], p[1])
                })
                .collect();
        }
    }
    Vec::new()
}

#[test]
fn the_emulator_imports_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let problems = check(&src);
    assert!(problems.is_empty(), "layering:\n{}", problems.join("\n"));
}

/// A forged crate in a fresh directory under the target directory.
struct Forged(PathBuf);

impl Forged {
    fn new(name: &str, files: &[(&str, &str)]) -> Forged {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("layering-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        for (f, text) in files {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        }
        Forged(dir)
    }
}

impl Drop for Forged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_checker_sees_what_it_must() {
    let lib = "mod device;\nmod kernel;\nmod model;\nmod state;\npub struct Root;\n";
    // Clean: device -> state -> model, kernel -> device; comments, strings and characters
    // that look like paths are not paths.
    let clean = Forged::new(
        "clean",
        &[
            ("lib.rs", lib),
            ("model/mod.rs", "pub(crate) mod qp;\n"),
            (
                "model/qp.rs",
                "pub(crate) struct Q; // crate::state::World\n",
            ),
            (
                "state.rs",
                "use crate::model::qp::Q;\npub(crate) struct World(Q);\n",
            ),
            (
                "device/mod.rs",
                "mod fetch;\nuse crate::state::World;\nfn f() { let _ = \"crate::kernel::x\"; let _ = '{'; }\n",
            ),
            ("device/fetch.rs", "use super::*;\n/* crate::kernel::y */\n"),
            (
                "kernel/mod.rs",
                "fn g<'a>(_: &'a u8) { crate::device::step(); }\n",
            ),
        ],
    );
    assert_eq!(check(&clean.0), Vec::<String>::new());

    // A use group that reaches up: state -> device -> state.
    let up = Forged::new(
        "group",
        &[
            ("lib.rs", lib),
            ("model/mod.rs", ""),
            ("state.rs", "use crate::{device::Qp, model};\n"),
            ("device/mod.rs", "use crate::state::World;\n"),
            ("kernel/mod.rs", ""),
        ],
    );
    let p = check(&up.0);
    assert!(p.iter().any(|l| l.contains("circle")), "{p:?}");
    assert!(p.iter().any(|l| l.starts_with("state -> device")), "{p:?}");

    // `super::` inside an inline module of the device names the device's own file: no edge;
    // a root item named from below is refused; the device naming the kernel is refused.
    let inline = Forged::new(
        "inline",
        &[
            ("lib.rs", lib),
            ("model/mod.rs", "use crate::Root;\n"),
            ("state.rs", ""),
            (
                "device/mod.rs",
                "mod imp {\n    use super::helper;\n}\nfn helper() { crate::kernel::tick(); }\n",
            ),
            ("kernel/mod.rs", ""),
        ],
    );
    let p = check(&inline.0);
    assert!(
        p.iter().any(|l| l.contains("an item of the crate root")),
        "{p:?}"
    );
    assert!(p.iter().any(|l| l.starts_with("device -> kernel")), "{p:?}");
    assert!(!p.iter().any(|l| l.contains("circle")), "{p:?}");
}
