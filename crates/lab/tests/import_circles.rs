//! No module of the lab imports a module that imports it back: shared types live in leaf
//! modules, so each module can be read (and changed) knowing only what is below it.
//!
//! A module's imports are the `crate::…`, `super::…` and `self::…` paths in its code
//! (comments and its `#[cfg(test)] mod tests` left out), resolved to the longest prefix that
//! names a module file. A module and its own ancestors are not a circle: a parent declares
//! and re-exports its children.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `directory`.
fn sources(directory: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(directory).expect("the source directory is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(path);
        }
    }
}

/// The module path of a source file, as its components (`[]` for the crate root).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(root).expect("under the root");
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|component| component.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its test module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths after each `crate::`, `super::` or `self::` in `code`, with which of the three:
/// the lowercase segments that follow, up to the first character that is not part of one
/// (`{`, `;`, `(`, a type's capital).
fn references(code: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut found = Vec::new();
    for keyword in ["crate", "super", "self"] {
        let pattern = format!("{keyword}::");
        let mut rest = code;
        while let Some(at) = rest.find(&pattern) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + pattern.len()..];
            if before.is_some_and(|character| character.is_alphanumeric() || character == '_') {
                continue;
            }
            let span: String = rest
                .chars()
                .take_while(|character| {
                    character.is_ascii_lowercase()
                        || character.is_ascii_digit()
                        || *character == '_'
                        || *character == ':'
                })
                .collect();
            let path = span
                .split("::")
                .filter(|segment| !segment.is_empty())
                .map(str::to_string)
                .collect();
            found.push((keyword, path));
        }
    }
    found
}

/// Goal: no lab module imports a module that imports it back. Method: resolve every
/// module's paths to module files and look for pairs that name each other.
#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|file| module_of(&root, file)).collect();
    let mut imports: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let module = module_of(&root, file);
        let code = code_of(&fs::read_to_string(file).expect("a readable source"));
        let mut targets = BTreeSet::new();
        for (keyword, path) in references(&code) {
            let mut full = match keyword {
                "crate" => Vec::new(),
                "super" => module[..module.len().saturating_sub(1)].to_vec(),
                _ => module.clone(),
            };
            full.extend(path);
            if let Some(length) = (1..=full.len())
                .rev()
                .find(|&length| modules.contains(&full[..length]))
            {
                let target = full[..length].to_vec();
                if target != module {
                    targets.insert(target);
                }
            }
        }
        imports.insert(module, targets);
    }
    assert!(
        imports.len() > 10,
        "the lab's modules were found: {:?}",
        imports.keys()
    );
    let mut circles = Vec::new();
    for (module, targets) in &imports {
        for target in targets {
            let related = module.starts_with(target) || target.starts_with(module);
            if !related && module < target && imports[target].contains(module) {
                circles.push(format!("{} <-> {}", module.join("::"), target.join("::")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "modules that import each other: {circles:?}"
    );
}
