//! Demangling: Rust (v0 and legacy, without the legacy hash) and C++ Itanium.

/// Demangles a linkage name; `None` when it is not mangled (C names, or
/// names DWARF already gives in source form).
pub fn demangle(raw: &str) -> Option<String> {
    if let Ok(rust) = rustc_demangle::try_demangle(raw) {
        // `{:#}` drops the `::h0123…` hash of legacy symbols.
        return Some(format!("{rust:#}"));
    }
    if raw.starts_with("_Z") {
        let symbol = cpp_demangle::Symbol::new(raw.as_bytes()).ok()?;
        let options = cpp_demangle::DemangleOptions::new();
        return symbol.demangle_with_options(&options).ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn rust_legacy_v0_and_cpp() {
        assert_eq!(
            demangle("_ZN4core3fmt9Formatter3pad17h0123456789abcdefE").as_deref(),
            Some("core::fmt::Formatter::pad")
        );
        assert_eq!(
            demangle("_RNvCs15kBYyAo9fc_7mycrate7example").as_deref(),
            Some("mycrate::example")
        );
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi").as_deref(),
            Some("std::vector<int, std::allocator<int> >::push_back(int const&)")
        );
        assert_eq!(demangle("main"), None);
        assert_eq!(demangle("_Z"), None);
    }
}
