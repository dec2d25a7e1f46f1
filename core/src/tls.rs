//! [`TlsFiles`]: the certificate files a backend's TLS connection is set up with.

use std::path::PathBuf;

use crate::{Error, Result};

/// PEM files for a TLS connection to a server (PostgreSQL, Redis), as the backends' configs
/// hold them. Empty (the default): the server's certificate is checked against the
/// backend's default roots and no client certificate is sent.
///
/// ```
/// use dedup_core::TlsFiles;
/// let tls = TlsFiles { ca: Some("/etc/dedup/ca.crt".into()), ..TlsFiles::default() };
/// assert!(tls.validate().is_ok());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate(s) that signed the server's certificate, replacing the default
    /// roots.
    pub ca: Option<PathBuf>,
    /// A client certificate (chain) for servers that authenticate clients by certificate.
    pub client_cert: Option<PathBuf>,
    /// The private key of `client_cert`.
    pub client_key: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether no file is set.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client_cert.is_none() && self.client_key.is_none()
    }

    /// A client certificate needs its key and the other way round.
    pub fn validate(&self) -> Result<()> {
        if self.client_cert.is_some() != self.client_key.is_some() {
            return Err(Error::invalid(
                "tls",
                "a client certificate and its key go together: set both or neither",
            ));
        }
        Ok(())
    }

    /// Read a file named here, as an error that names it (without its contents).
    pub fn read(path: &std::path::Path) -> Result<Vec<u8>> {
        std::fs::read(path)
            .map_err(|e| Error::invalid("tls", format!("cannot read {}: {e}", path.display())))
    }
}
