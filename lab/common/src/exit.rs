//! How every program ends: on failure, `error: ...` and one `caused by: ...` line per
//! cause in the error's source chain, in the errors' own words (never a `Debug` dump), and
//! a non-zero exit code.

use std::error::Error;
use std::io::Write;
use std::process::ExitCode;

/// The exit code for `result`, after printing its error chain (if any) to stderr.
///
/// Use it as the whole of `main`:
///
/// ```ignore
/// #[tokio::main]
/// async fn main() -> std::process::ExitCode {
///     dedup_lab::exit::report(run().await)
/// }
/// ```
pub fn report(result: Result<(), Box<dyn Error>>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut stderr = std::io::stderr().lock();
            for line in chain_lines(e.as_ref()) {
                let _ = writeln!(stderr, "{line}");
            }
            ExitCode::FAILURE
        }
    }
}

/// `error: ...` then `caused by: ...` per cause. A cause whose text the previous line
/// already shows in full (drivers often repeat their source in their own message) is
/// left out.
pub fn chain_lines(error: &dyn Error) -> Vec<String> {
    let mut lines = vec![format!("error: {error}")];
    let mut previous = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let text = e.to_string();
        if !previous.contains(&text) {
            lines.push(format!("caused by: {text}"));
        }
        previous = text;
        cause = e.source();
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_each_cause_once_in_plain_words() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let io_text = io.to_string();
        let store = dedup_core::Error::backend("postgres", true, io)
            .during("connecting")
            .with_hint("nothing listens at 127.0.0.1:1");
        let lines = chain_lines(&store);
        assert_eq!(
            lines,
            vec![
                "error: postgres backend error while connecting (retryable): nothing listens \
                 at 127.0.0.1:1"
                    .to_owned(),
                format!("caused by: {io_text}"),
            ]
        );
        assert!(!lines.iter().any(|l| l.contains("Backend {")));
    }
}
