//! Errors as people read them: a message followed by its causes.

/// `error`'s message followed by each of its causes (`source()`), joined by `": "`; a
/// cause whose text the message already contains is not repeated. For logs, reasons
/// kept as text (a path's reason, a refused borrow) and bindings that carry one string.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = c.source();
    }
    text
}

/// Displays an error as [`chain`] does: for log fields (`error = %Chain(&e)`).
pub struct Chain<'a>(pub &'a dyn std::error::Error);

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&chain(self.0))
    }
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);
    #[derive(Debug, thiserror::Error)]
    #[error("middle: inner")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn causes_follow_the_message_once() {
        let e = Outer(Middle(std::io::Error::other("inner")));
        assert_eq!(super::chain(&e), "outer: middle: inner");
        assert_eq!(super::Chain(&e).to_string(), "outer: middle: inner");
    }
}
