//! An error with its causes on one line, for statuses, Events and log fields: the controller
//! and the command line describe errors the same way.

/// An error with its chain of causes, for status messages (`a: b: c`).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("connect")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error("backend unavailable: connection refused")]
    struct Repeating(#[source] Inner);

    #[test]
    fn joins_sources_without_repeating_them() {
        assert_eq!(error_chain(&Outer(Inner)), "connect: connection refused");
        assert_eq!(
            error_chain(&Repeating(Inner)),
            "backend unavailable: connection refused"
        );
    }
}
