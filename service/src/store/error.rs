//! The store's one error vocabulary, returned by [`super::MetadataStore`],
//! [`super::BlobStore`] and the symbol store: what went wrong in terms a
//! caller can act on (not found, rejected, conflict, unavailable,
//! internal), each keeping its source. HTTP and gRPC statuses are chosen
//! from it only at the edge (`crate::error`).

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A store failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No such row or object.
    #[error("{0}")]
    NotFound(String),
    /// The content is not what the request claims (not ELF, wrong
    /// build-ID, wrong kind, a source path the DWARF does not name).
    #[error("{0}")]
    Rejected(String),
    /// A publisher bound to one tenant would replace what another tenant
    /// (or everyone) published.
    #[error("{0}")]
    Conflict(String),
    /// The database or object store cannot be reached now (a retry may
    /// succeed).
    #[error("{what} unavailable: {source}")]
    Unavailable {
        /// `database`, `object store`, …
        what: &'static str,
        /// The cause.
        #[source]
        source: Source,
    },
    /// Anything else: a bug, a broken invariant, a failed disk.
    #[error("{what}: {source}")]
    Internal {
        /// `database`, `object store`, `blob I/O`, …
        what: &'static str,
        /// The cause.
        #[source]
        source: Source,
    },
}

/// A store result.
pub type Result<T> = std::result::Result<T, Error>;

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::RowNotFound => Self::NotFound("no such row".into()),
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => Self::Unavailable {
                what: "database",
                source: Box::new(e),
            },
            e => Self::Internal {
                what: "database",
                source: Box::new(e),
            },
        }
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Self::Internal {
            what: "database migration",
            source: Box::new(e),
        }
    }
}

impl From<object_store::Error> for Error {
    fn from(e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { path, .. } => {
                Self::NotFound(format!("{path} is not in the object store"))
            }
            e => Self::Unavailable {
                what: "object store",
                source: Box::new(e),
            },
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self::Internal {
            what: "I/O",
            source: Box::new(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_map_to_what_a_caller_can_do() {
        assert!(matches!(
            Error::from(sqlx::Error::RowNotFound),
            Error::NotFound(_)
        ));
        assert!(matches!(
            Error::from(sqlx::Error::PoolTimedOut),
            Error::Unavailable {
                what: "database",
                ..
            }
        ));
        assert!(matches!(
            Error::from(sqlx::Error::ColumnNotFound("x".into())),
            Error::Internal {
                what: "database",
                ..
            }
        ));
        let e = Error::from(std::io::Error::other("disk"));
        assert_eq!(e.to_string(), "I/O: disk");
        assert!(
            std::error::Error::source(&e).is_some(),
            "the source is kept"
        );
    }
}
