//! Repository URLs on object storage: `s3:http://HOST:PORT/BUCKET/PREFIX` (or `https`).

use std::fmt;

use crate::error::{RemoteError, Result};

/// Where a repository lives on S3-compatible object storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectUrl {
    /// `http://host:port` or `https://host:port`, without a path.
    pub endpoint: String,
    pub bucket: String,
    /// Key prefix of every object of the repository, without leading or trailing `/`; may be
    /// empty (the repository is the whole bucket).
    pub prefix: String,
}

/// The scheme that marks an object-storage repository.
pub const SCHEME: &str = "s3:";

impl ObjectUrl {
    /// True when `text` names an object-storage repository rather than a directory.
    pub fn is_object_url(text: &str) -> bool {
        text.starts_with(SCHEME)
    }

    /// Parses `s3:http://host:port/bucket/prefix`.
    pub fn parse(text: &str) -> Result<ObjectUrl> {
        let invalid = |detail: &str| RemoteError::Url {
            url: text.to_string(),
            detail: detail.to_string(),
        };
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| invalid("must start with s3:"))?;
        let (scheme, rest) = if let Some(rest) = rest.strip_prefix("http://") {
            ("http", rest)
        } else if let Some(rest) = rest.strip_prefix("https://") {
            ("https", rest)
        } else {
            return Err(invalid(
                "give the endpoint with its scheme: s3:http://HOST:PORT/BUCKET/PREFIX or \
                 s3:https://HOST/BUCKET/PREFIX",
            ));
        };
        let mut parts = rest.splitn(3, '/');
        let host = parts.next().unwrap_or_default();
        let bucket = parts.next().unwrap_or_default();
        let prefix = parts.next().unwrap_or_default().trim_matches('/');
        if host.is_empty() {
            return Err(invalid("the endpoint's host is missing"));
        }
        if bucket.is_empty() {
            return Err(invalid(
                "the bucket is missing: s3:http://HOST:PORT/BUCKET/PREFIX",
            ));
        }
        if prefix
            .split('/')
            .any(|part| part == "." || part == ".." || (part.is_empty() && !prefix.is_empty()))
        {
            return Err(invalid("the prefix has an empty, '.' or '..' part"));
        }
        Ok(ObjectUrl {
            endpoint: format!("{scheme}://{host}"),
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The object key of `name` (a repository-relative name).
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// The repository-relative name of object `key`, or `None` when it lies outside the
    /// repository's prefix.
    pub fn name_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        if self.prefix.is_empty() {
            Some(key)
        } else {
            key.strip_prefix(self.prefix.as_str())?.strip_prefix('/')
        }
    }
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.endpoint, self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: URLs parse into endpoint, bucket and prefix and print back the same. Method:
    /// parse several forms and malformed ones.
    #[test]
    fn parses_and_prints() {
        let url = ObjectUrl::parse("s3:http://127.0.0.1:3900/bucket/some/prefix/").unwrap();
        assert_eq!(url.endpoint, "http://127.0.0.1:3900");
        assert_eq!(url.bucket, "bucket");
        assert_eq!(url.prefix, "some/prefix");
        assert_eq!(
            url.to_string(),
            "s3:http://127.0.0.1:3900/bucket/some/prefix"
        );
        assert_eq!(url.key("config.json"), "some/prefix/config.json");
        assert_eq!(url.name_of("some/prefix/keys/a"), Some("keys/a"));
        assert_eq!(url.name_of("some/prefixes/a"), None);
        let bare = ObjectUrl::parse("s3:https://s3.example.org/b").unwrap();
        assert_eq!(bare.prefix, "");
        assert_eq!(bare.key("x"), "x");
        for bad in [
            "http://h/b",
            "s3:h/b",
            "s3:http:///b",
            "s3:http://h",
            "s3:http://h/b/a//c",
            "s3:http://h/b/../c",
        ] {
            assert!(ObjectUrl::parse(bad).is_err(), "{bad} parsed");
        }
    }
}
