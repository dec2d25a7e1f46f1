//! How the command line fails: one `error:` line saying what could not be done, one
//! `caused by:` line per error in the source chain, a `hint:` saying what to do, and the
//! exit code (1 failure, 2 usage, 3 not found, 4 replay left some). Never a Debug dump.

use std::error::Error as StdError;
use std::process::ExitCode;

use crate::screen::line;

/// Exit code: the command failed.
pub(crate) const FAILURE: u8 = 1;
/// Exit code: the command line was wrong (as clap's own usage errors).
pub(crate) const USAGE: u8 = 2;
/// Exit code: the key (or the store's file) does not exist.
pub(crate) const NOT_FOUND: u8 = 3;
/// Exit code: `dedup replay` left some picked messages among the dead letters.
pub(crate) const LEFT: u8 = 4;

/// A failed command, ready to print.
#[derive(Debug)]
pub(crate) struct Failure {
    message: String,
    causes: Vec<String>,
    hint: Option<String>,
    code: u8,
}

impl Failure {
    /// A failure (exit code 1) saying `message`.
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            causes: Vec::new(),
            hint: None,
            code: FAILURE,
        }
    }

    /// A usage error (exit code 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Failure::new(message).code(USAGE)
    }

    /// Nothing there (exit code 3).
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Failure::new(message).code(NOT_FOUND)
    }

    /// Some picked messages were left (exit code 4).
    pub(crate) fn left(message: impl Into<String>) -> Self {
        Failure::new(message).code(LEFT)
    }

    fn code(mut self, code: u8) -> Self {
        self.code = code;
        self
    }

    /// Add `error` and every error in its source chain as causes.
    pub(crate) fn cause(mut self, error: impl StdError) -> Self {
        self.causes.push(error.to_string());
        let mut source = error.source();
        while let Some(e) = source {
            self.causes.push(e.to_string());
            source = e.source();
        }
        self
    }

    /// What the operator can do about it.
    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// The store failed while `doing` something: the error's chain, a hint by its kind,
    /// exit code 2 for input the store rejected.
    pub(crate) fn store(doing: impl Into<String>, error: dedup_core::Error) -> Self {
        use dedup_core::Error;
        let hint = match &error {
            Error::InvalidInput { .. } => "check the arguments (see `dedup --help`)",
            Error::SchemaNotMigrated { .. } => {
                "this command only reads and creates no table: run `dedup migrate` first (as a \
                 role that may create and alter tables)"
            }
            Error::SchemaTooNew { .. } => {
                "a newer dedup created this table: use a dedup command line of that version"
            }
            Error::Corrupt { .. } => {
                "a value under the store's table or key prefix is not a dedup record: \
                 check what else writes there"
            }
            Error::LeaseLost { .. } => {
                "the key changed hands meanwhile: look again with `dedup inspect`"
            }
            Error::Backend {
                retryable: true, ..
            } => "the failure looks transient: try again",
            _ => {
                "check the store URL (--store or DEDUP_STORE_URL) and that the server is up; \
                 if the table does not exist yet, run `dedup migrate`"
            }
        };
        let code = if error.is_invalid_input() {
            USAGE
        } else {
            FAILURE
        };
        Failure::new(doing).cause(error).hint(hint).code(code)
    }

    /// Print to standard error, one line each (control characters and newlines in an
    /// error's text escaped: it may quote a payload or a key), and give the exit code.
    pub(crate) fn report(self) -> ExitCode {
        eprintln!("error: {}", line(&self.message));
        for cause in &self.causes {
            eprintln!("caused by: {}", line(cause));
        }
        if let Some(hint) = &self.hint {
            eprintln!("hint: {}", line(hint));
        }
        ExitCode::from(self.code)
    }
}
