//! Errors as people read them: a message followed by its causes.

/// `error`'s message followed by each of its causes (`source()`), joined by `": "`; a
/// cause whose text the message already contains is not repeated. For logs, reasons
/// kept as text (a path's reason, a refused borrow) and bindings that carry one string.
/// The source locations Zenoh appends to its messages (` at …/tcp.rs:61.`) are left
/// out: they name a file of a dependency, which tells a user nothing.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = without_locations(&error.to_string());
    let mut cause = error.source();
    while let Some(c) = cause {
        let t = without_locations(&c.to_string());
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = c.source();
    }
    text
}

/// `text` without ` at <path>.rs:<line>` (and the `.` that may end it).
fn without_locations(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(" at ") {
        let after = &rest[at + 4..];
        let end = after.find(|c: char| c.is_whitespace() || c == ']').unwrap_or(after.len());
        let token = after[..end].trim_end_matches('.');
        let is_location = token.rsplit_once(".rs:").is_some_and(|(file, line)| {
            !file.is_empty() && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit())
        });
        if is_location {
            out.push_str(&rest[..at]);
            rest = &after[end..];
        } else {
            out.push_str(&rest[..at + 4]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
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

    #[test]
    fn source_locations_are_left_out() {
        let zenoh = "Can not create a new TCP listener bound to tcp/127.0.0.1:5: [127.0.0.1:5: Address already in use \
                     (os error 98) at /root/.cargo/registry/src/x/zenoh-link-commons-1.10.2/src/tcp.rs:61.] at \
                     /root/.cargo/registry/src/x/zenoh-link-tcp-1.10.2/src/unicast.rs:338.";
        assert_eq!(
            super::without_locations(zenoh),
            "Can not create a new TCP listener bound to tcp/127.0.0.1:5: [127.0.0.1:5: Address already in use (os error 98)]"
        );
        // Words that only look alike stay.
        for kept in ["look at the log", "at tcp/[::]:7447", "listen at x.rs:abc", "at .rs:1", "ends at"] {
            assert_eq!(super::without_locations(kept), kept);
        }
    }
}
