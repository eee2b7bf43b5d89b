//! The daemon's layout, as issue #18 set it: its top-level modules import each other without a
//! circle (a module reached from another never reaches back to it), and no function of its
//! code is longer than 120 lines. Read from the sources (outside their `#[cfg(test)]` modules):
//! a `crate::NAME` path in module A is an edge from A to NAME.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest function allowed, in lines from its `fn` to its closing brace.
const MAX_FN_LINES: usize = 120;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, with the top-level module it belongs to.
fn files(dir: &Path, top: Option<&str>, out: &mut Vec<(String, PathBuf)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        let module = top.map_or_else(|| name.clone(), str::to_string);
        if p.is_dir() {
            files(&p, Some(&module), out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push((module, p));
        }
    }
}

/// The code of a file without its test module (at the file's end, after `#[cfg(test)]`) and
/// without comments.
fn code(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap();
    let s = match s.find("#[cfg(test)]\nmod ") {
        Some(i) => &s[..i],
        None => &s[..],
    };
    s.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a piece of code names through `crate::` (`crate::a::b`,
/// `crate::{a::X, b}`).
fn named_modules(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The top-level items of the group, up to its closing brace.
            let (mut depth, mut start) = (0, 0);
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.insert(ident(&group[start..k]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(&group[start..k]));
                        start = k + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out
}

#[test]
fn no_import_circle_among_the_daemons_modules() {
    let mut all = Vec::new();
    files(&src(), None, &mut all);
    let modules: BTreeSet<String> = all
        .iter()
        .map(|(m, _)| m.clone())
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, path) in &all {
        if !modules.contains(m) {
            continue;
        }
        for n in named_modules(&code(path)) {
            if n != *m && modules.contains(&n) {
                edges.entry(m.clone()).or_default().insert(n);
            }
        }
    }
    assert!(
        edges.get("fault").is_some_and(|e| e.contains("mm")),
        "the parser sees no edge fault -> mm: it reads nothing"
    );
    // A circle: a path from `n` back to `m` for an edge m -> n.
    let reaches = |from: &str, to: &str| -> Option<Vec<String>> {
        let mut path = vec![from.to_string()];
        let mut seen = BTreeSet::new();
        fn walk(
            edges: &BTreeMap<String, BTreeSet<String>>,
            to: &str,
            path: &mut Vec<String>,
            seen: &mut BTreeSet<String>,
        ) -> bool {
            let here = path.last().unwrap().clone();
            if here == to {
                return true;
            }
            if !seen.insert(here.clone()) {
                return false;
            }
            for n in edges.get(&here).into_iter().flatten() {
                path.push(n.clone());
                if walk(edges, to, path, seen) {
                    return true;
                }
                path.pop();
            }
            false
        }
        walk(&edges, to, &mut path, &mut seen).then_some(path)
    };
    let mut circles = Vec::new();
    for (m, ns) in &edges {
        for n in ns {
            if let Some(back) = reaches(n, m) {
                circles.push(format!("{m} -> {}", back.join(" -> ")));
            }
        }
    }
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

#[test]
fn no_function_of_the_daemon_over_120_lines() {
    let mut all = Vec::new();
    files(&src(), None, &mut all);
    let mut long = Vec::new();
    let mut seen = 0;
    for (_, path) in &all {
        let code = code(path);
        let lines: Vec<&str> = code.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            let indent = &l[..l.len() - t.len()];
            let head = [
                "pub fn ",
                "fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
                "const fn ",
            ]
            .iter()
            .any(|p| t.starts_with(p))
                || (t.starts_with("pub(in ") && t.contains(") fn "));
            if !head || t.ends_with(';') {
                continue;
            }
            // The function ends at the first line that is its indentation and a closing brace.
            let close = format!("{indent}}}");
            if let Some(n) = lines[i..].iter().position(|x| *x == close) {
                seen += 1;
                if n + 1 > MAX_FN_LINES {
                    let name: String = t
                        .split("fn ")
                        .nth(1)
                        .unwrap_or("")
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    long.push(format!(
                        "{}:{} {name}: {} lines",
                        path.display(),
                        i + 1,
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        seen > 500,
        "only {seen} functions found: the parser is broken"
    );
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines: {long:#?}"
    );
}
