//! `onecopy analyze`: how much would deduplication save on these files? (in progress)
