/// Normalises a source path the way debuginfod servers match them: `//`
/// collapses to `/`, and `.`/`..` segments are removed as in RFC 3986
/// §5.2.4 (`..` at the root stays at the root). An absolute path stays
/// absolute; a relative one stays relative.
pub fn canonical_path(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|last| *last != "..") {
                    out.pop();
                } else if !absolute {
                    out.push("..");
                }
            }
            s => out.push(s),
        }
    }
    let joined = out.join("/");
    if absolute {
        format!("/{joined}")
    } else {
        joined
    }
}

/// Percent-escapes a source path the way elfutils' debuginfod client does
/// before putting it in a URL: every byte but `A-Za-z0-9-._~` and `/`.
pub fn escape_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{canonical_path, escape_path};

    #[test]
    fn escapes_like_the_elfutils_client() {
        assert_eq!(
            escape_path("/src/p++r$#o^^g.c"),
            "/src/p%2B%2Br%24%23o%5E%5Eg.c"
        );
        assert_eq!(escape_path("/my proj/a-b_c.~d"), "/my%20proj/a-b_c.~d");
    }

    #[test]
    fn collapses_like_elfutils() {
        assert_eq!(canonical_path("/src/../src/./hello.c"), "/src/hello.c");
        assert_eq!(canonical_path("/tmp//dtest"), "/tmp/dtest");
        assert_eq!(canonical_path("//tmp/a.c"), "/tmp/a.c");
        assert_eq!(canonical_path("/foobar///./../prog.c"), "/prog.c");
        assert_eq!(canonical_path("/../../etc/passwd"), "/etc/passwd");
        assert_eq!(canonical_path("a/../../b.c"), "../b.c");
        assert_eq!(canonical_path("/"), "/");
    }
}
