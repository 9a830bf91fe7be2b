//! Exclude patterns of a directory backup (`backup create --exclude GLOB`), matched as restic
//! matches them.
//!
//! A pattern is matched against the absolute path of each name the walk meets, component by
//! component (components are split at `/`):
//!
//! - within a component, `*` matches any run of bytes, `?` one byte, `[abc]`, `[a-z]` and
//!   `[!a-z]` (or `[^a-z]`) one byte of a class, and `\x` the byte `x` itself; none of them
//!   matches a `/`;
//! - a component `**` matches any number of components, none included;
//! - a pattern that starts with `/` matches from the root of the file system; any other
//!   pattern may match the path's last components (so `*.tmp` excludes every name ending in
//!   `.tmp`, and `cache/*.bin` any `.bin` file directly in a directory named `cache`).
//!
//! An excluded directory is not entered, so what it holds is excluded with it. Exclude files
//! (`--exclude-file`) hold one pattern a line; blank lines and lines starting with `#` are
//! ignored and surrounding white space is trimmed.

use std::path::Path;

use crate::error::{BackupError, Result};

/// One component of a pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Component {
    /// `**`: any number of components.
    Any,
    /// A glob over one component's bytes.
    Glob(Vec<u8>),
}

/// A parsed exclude pattern; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExcludePattern {
    /// The pattern as given, for messages and records.
    text: String,
    components: Vec<Component>,
}

impl ExcludePattern {
    /// Parses `text`, refusing an empty pattern and an unclosed `[` class.
    pub fn parse(text: &str) -> Result<ExcludePattern> {
        let invalid =
            |why: &str| BackupError::InvalidArgument(format!("exclude pattern {text:?}: {why}"));
        let trimmed = text.trim_end_matches('/');
        if trimmed.is_empty() {
            return Err(invalid(
                "it is empty or only `/`, which would exclude everything",
            ));
        }
        let anchored = trimmed.starts_with('/');
        let mut components = Vec::new();
        if !anchored {
            components.push(Component::Any);
        }
        for part in trimmed.split('/').filter(|part| !part.is_empty()) {
            if part == "**" {
                if components.last() != Some(&Component::Any) {
                    components.push(Component::Any);
                }
                continue;
            }
            check_classes(part.as_bytes()).map_err(invalid)?;
            components.push(Component::Glob(part.as_bytes().to_vec()));
        }
        Ok(ExcludePattern {
            text: text.to_string(),
            components,
        })
    }

    /// The pattern as given.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// True when the pattern matches the absolute path `path` (bytes, `/`-separated).
    pub fn matches(&self, path: &[u8]) -> bool {
        let components: Vec<&[u8]> = path
            .split(|&byte| byte == b'/')
            .filter(|component| !component.is_empty())
            .collect();
        match_components(&self.components, &components)
    }
}

/// Checks that every `[` class of a component is closed.
fn check_classes(glob: &[u8]) -> std::result::Result<(), &'static str> {
    let mut index = 0;
    while index < glob.len() {
        match glob[index] {
            b'\\' => index += 2,
            b'[' => {
                index = class_end(glob, index).ok_or("a `[` class is not closed with `]`")?;
            }
            _ => index += 1,
        }
    }
    Ok(())
}

/// The index after the `]` closing the class that starts at `glob[start] == b'['`.
fn class_end(glob: &[u8], start: usize) -> Option<usize> {
    let mut index = start + 1;
    if matches!(glob.get(index), Some(b'!' | b'^')) {
        index += 1;
    }
    // A `]` right after the opening (and negation) belongs to the class.
    if glob.get(index) == Some(&b']') {
        index += 1;
    }
    while index < glob.len() {
        match glob[index] {
            b'\\' => index += 2,
            b']' => return Some(index + 1),
            _ => index += 1,
        }
    }
    None
}

fn match_components(pattern: &[Component], path: &[&[u8]]) -> bool {
    match pattern.first() {
        None => path.is_empty(),
        Some(Component::Any) => {
            (0..=path.len()).any(|skip| match_components(&pattern[1..], &path[skip..]))
        }
        Some(Component::Glob(glob)) => {
            !path.is_empty()
                && glob_matches(glob, path[0])
                && match_components(&pattern[1..], &path[1..])
        }
    }
}

/// Matches one component's glob against one name.
fn glob_matches(glob: &[u8], name: &[u8]) -> bool {
    let Some(&first) = glob.first() else {
        return name.is_empty();
    };
    match first {
        b'*' => (0..=name.len()).any(|skip| glob_matches(&glob[1..], &name[skip..])),
        b'?' => !name.is_empty() && glob_matches(&glob[1..], &name[1..]),
        b'[' => {
            let Some(end) = class_end(glob, 0) else {
                return false; // Refused by `parse`; never matches.
            };
            !name.is_empty()
                && class_matches(&glob[1..end - 1], name[0])
                && glob_matches(&glob[end..], &name[1..])
        }
        b'\\' if glob.len() > 1 => {
            name.first() == Some(&glob[1]) && glob_matches(&glob[2..], &name[1..])
        }
        literal => name.first() == Some(&literal) && glob_matches(&glob[1..], &name[1..]),
    }
}

/// Matches one byte against the inside of a class (between `[` and `]`).
fn class_matches(class: &[u8], byte: u8) -> bool {
    let (negated, mut rest) = match class.first() {
        Some(b'!' | b'^') => (true, &class[1..]),
        _ => (false, class),
    };
    let mut found = false;
    while let Some(&low) = rest.first() {
        let (low, after) = if low == b'\\' && rest.len() > 1 {
            (rest[1], &rest[2..])
        } else {
            (low, &rest[1..])
        };
        if after.len() >= 2 && after[0] == b'-' {
            let high = after[1];
            found |= low <= byte && byte <= high;
            rest = &after[2..];
        } else {
            found |= low == byte;
            rest = after;
        }
    }
    found != negated
}

/// The exclude patterns of one backup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Excludes {
    patterns: Vec<ExcludePattern>,
}

impl Excludes {
    /// Parses each pattern.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Excludes> {
        let patterns = patterns
            .iter()
            .map(|pattern| ExcludePattern::parse(pattern.as_ref()))
            .collect::<Result<_>>()?;
        Ok(Excludes { patterns })
    }

    /// Adds the patterns of an exclude file (see the module documentation).
    pub fn add_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            BackupError::InvalidArgument(format!(
                "exclude file {}: {error} (it must be a readable UTF-8 text file, one pattern \
                 a line)",
                path.display()
            ))
        })?;
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            self.patterns
                .push(ExcludePattern::parse(line).map_err(|error| {
                    BackupError::InvalidArgument(format!(
                        "exclude file {}: {error}",
                        path.display()
                    ))
                })?);
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The patterns as given.
    pub fn texts(&self) -> Vec<String> {
        self.patterns
            .iter()
            .map(|pattern| pattern.text().to_string())
            .collect()
    }

    /// True when a pattern matches the absolute path `path`.
    pub fn excludes(&self, path: &[u8]) -> bool {
        self.patterns.iter().any(|pattern| pattern.matches(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn excluded(pattern: &str, path: &str) -> bool {
        ExcludePattern::parse(pattern)
            .unwrap()
            .matches(path.as_bytes())
    }

    /// Goal: component globs, `**`, anchoring and classes match as documented. Method: a
    /// table of patterns and paths with the expected answer.
    #[test]
    fn patterns_match_as_documented() {
        let table = [
            ("*.tmp", "/home/me/a.tmp", true),
            ("*.tmp", "/home/me/a.tmp/x", false),
            ("*.tmp", "/home/me/a.tmpx", false),
            ("cache", "/home/me/cache", true),
            ("cache", "/home/me/cached", false),
            ("cache/*.bin", "/x/cache/a.bin", true),
            ("cache/*.bin", "/x/cache/y/a.bin", false),
            ("cache/**/*.bin", "/x/cache/y/z/a.bin", true),
            ("cache/**/*.bin", "/x/cache/a.bin", true),
            ("/home/*/.cache", "/home/me/.cache", true),
            ("/home/*/.cache", "/srv/home/me/.cache", false),
            ("/home", "/home", true),
            ("/home/", "/home", true),
            ("/**/*.o", "/a/b/c.o", true),
            ("?.txt", "/d/a.txt", true),
            ("?.txt", "/d/ab.txt", false),
            ("[ab].txt", "/d/b.txt", true),
            ("[!ab].txt", "/d/b.txt", false),
            ("[^ab].txt", "/d/c.txt", true),
            ("file[0-9]", "/d/file7", true),
            ("file[0-9]", "/d/filex", false),
            ("\\*", "/d/*", true),
            ("\\*", "/d/a", false),
            ("*", "/anything/at/all", true),
            ("a*b*c", "/d/aXXbYYc", true),
            ("a*b*c", "/d/aXXbYY", false),
        ];
        for (pattern, path, expected) in table {
            assert_eq!(excluded(pattern, path), expected, "{pattern} on {path}");
        }
    }

    /// Goal: patterns that would exclude everything or cannot be read are refused, and exclude
    /// files skip comments and blank lines. Method: parse bad patterns; read a small file.
    #[test]
    fn bad_patterns_are_refused_and_files_are_read() {
        assert!(ExcludePattern::parse("").is_err());
        assert!(ExcludePattern::parse("/").is_err());
        assert!(ExcludePattern::parse("a[bc").is_err());
        let directory = tempfile::tempdir().unwrap();
        let file = directory.path().join("excludes");
        std::fs::write(&file, "# comment\n\n  *.log  \n/var/cache\n").unwrap();
        let mut excludes = Excludes::new(&["*.tmp"]).unwrap();
        excludes.add_file(&file).unwrap();
        assert_eq!(excludes.texts(), ["*.tmp", "*.log", "/var/cache"]);
        assert!(excludes.excludes(b"/srv/x.log"));
        assert!(excludes.excludes(b"/var/cache"));
        assert!(!excludes.excludes(b"/srv/var/cache"));
        std::fs::write(&file, "ok\n[broken\n").unwrap();
        let error = Excludes::default().add_file(&file).unwrap_err().to_string();
        assert!(error.contains("[broken"), "{error}");
    }
}
