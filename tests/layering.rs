//! The driver's modules import in one direction only: every `crate::` path in a file of
//! `src/` names a module on a lower layer than the file's own, as docs/architecture.md
//! ("Inside the driver") draws them. A new module, or an import that runs back up, fails here
//! with the file, the line and both layers.

use std::path::{Path, PathBuf};

/// The layers of docs/architecture.md, lowest first: a file may import from any module on a
/// lower layer, never from its own layer or a higher one (files of one folder module reach
/// each other through `super::`, which this test does not read).
const LAYERS: &[&[&str]] = &[
    &["types", "ring", "mmio"],
    &["error"],
    &["mem", "uverbs"],
    &["recorder", "context"],
    &["pd", "device"],
    &["ah"],
    &["wr"],
    &["ledger", "wc_fmt", "emulator"],
    &["cq", "srq", "qp::sq", "qp::rq"],
    &["qp"],
    &["xrc"],
    &["cm", "flow", "dc"],
    &["raw"],
    &["lib"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The module a file of `src/` belongs to: `qp/sq/post.rs` is `qp::sq`, `mem/wq.rs` is `mem`.
fn module_of(rel: &Path) -> String {
    let parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [one] => one.clone(),
        [a, b, ..] if a == "qp" && (b == "sq" || b == "rq") => format!("qp::{b}"),
        [a, ..] => a.clone(),
        [] => String::new(),
    }
}

/// The module a `crate::` path names: `crate::qp::sq::X` is `qp::sq`, `crate::qp::QpType`
/// is `qp`, `crate::Error` (a root re-export) is `lib`.
fn target_of(path: &str) -> String {
    let mut it = path.split("::");
    let first = it.next().unwrap_or_default();
    if first.starts_with(|c: char| c.is_ascii_uppercase()) || first.is_empty() {
        return "lib".into();
    }
    match (first, it.next()) {
        ("qp", Some(s @ ("sq" | "rq"))) => format!("qp::{s}"),
        _ => first.into(),
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `crate::` path in the code of `text` (comments and doc comments left out), with
/// its line number; a `use crate::{a, b}` group yields each member.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let before = rest[..i].chars().last();
            rest = &rest[i + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for m in group[..end].split(',') {
                    let m = m.trim();
                    if !m.is_empty() {
                        out.push((n + 1, m.to_string()));
                    }
                }
                continue;
            }
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            out.push((n + 1, rest[..end].to_string()));
        }
    }
    out
}

#[test]
fn no_module_imports_from_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let own = module_of(rel);
        let Some(own_layer) = layer(&own) else {
            bad.push(format!(
                "{}: module `{own}` is on no layer of docs/architecture.md",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        for (line, path) in crate_paths(&text) {
            let target = target_of(&path);
            if target == own {
                continue;
            }
            match layer(&target) {
                Some(t) if t < own_layer => {}
                t => bad.push(format!(
                    "src/{}:{line}: `crate::{path}` ({target}, layer {t:?}) from {own} (layer \
                     {own_layer})",
                    rel.display()
                )),
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports that run back up:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_sees_groups_roots_and_comments() {
    let text = "use crate::{mem::DbRec, wr::Sge};\n// crate::qp::leak\nlet x = crate::Error::X;\n\
                let y = crate::qp::sq::SendQueue::new; foo_crate::bar";
    let got: Vec<(usize, String)> = crate_paths(text);
    let targets: Vec<String> = got.iter().map(|(_, p)| target_of(p)).collect();
    assert_eq!(targets, ["mem", "wr", "lib", "qp::sq"]);
    assert_eq!(got[2].0, 3);
    assert_eq!(module_of(Path::new("qp/sq/post.rs")), "qp::sq");
    assert_eq!(module_of(Path::new("qp/mod.rs")), "qp");
    assert_eq!(module_of(Path::new("mem/wq.rs")), "mem");
    assert!(layer("qp::sq") < layer("qp") && layer("ledger") < layer("cq"));
}
