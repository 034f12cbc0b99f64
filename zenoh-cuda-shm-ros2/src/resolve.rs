//! ROS names as rcl checks and expands them: node names, namespaces, and topic names
//! that may be relative (`camera/image` in namespace `/robot1` is
//! `/robot1/camera/image`), private (`~/image` is `/<namespace>/<node>/image`) or carry
//! the substitutions `{node}`, `{ns}` and `{namespace}`. Remapping is not applied.
//!
//! The rules are those of rcl's topic-name validation and expansion and rmw's checks of
//! fully qualified names, node names and namespaces: letters, digits and `_` in each
//! `/`-separated token, no token starting with a digit, no empty token, no trailing `/`,
//! and a fully qualified topic name of at most [`MAX_TOPIC_LEN`] bytes.

use super::names::NameError;

/// The longest fully qualified topic name rmw accepts (255 less 8 bytes it keeps for
/// prefixes).
pub const MAX_TOPIC_LEN: usize = 247;
/// The longest node name rmw accepts.
pub const MAX_NODE_NAME_LEN: usize = 255;

fn invalid(what: &'static str, name: &str, reason: &'static str) -> NameError {
    NameError::Invalid { what, name: name.to_owned(), reason }
}

fn token_ok(t: &str) -> Result<(), &'static str> {
    if t.is_empty() {
        return Err("has an empty token ('//')");
    }
    if t.as_bytes()[0].is_ascii_digit() {
        return Err("has a token that starts with a digit");
    }
    if !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err("may hold only letters, digits, '_' and '/'");
    }
    Ok(())
}

/// Checks a node name: letters, digits and `_`, not starting with a digit.
///
/// # Errors
/// [`NameError::Empty`] for an empty name; [`NameError::Invalid`], saying which rule
/// is broken, for any other name that breaks them (longer than 255 bytes included).
pub fn validate_node_name(name: &str) -> Result<(), NameError> {
    const WHAT: &str = "node name";
    if name.is_empty() {
        return Err(NameError::Empty { what: WHAT });
    }
    if name.len() > MAX_NODE_NAME_LEN {
        return Err(invalid(WHAT, name, "is longer than 255 bytes"));
    }
    token_ok(name).map_err(|r| invalid(WHAT, name, if name.contains('/') { "may not hold '/'" } else { r }))
}

/// Checks a fully qualified name (a namespace, an enclave, an expanded topic): `/`, or
/// `/` followed by valid tokens, without a trailing `/`.
///
/// # Errors
/// [`NameError::Empty`] for an empty name; [`NameError::Invalid`], saying which rule
/// is broken, for any other name that breaks them (longer than 247 bytes included).
pub fn validate_absolute(what: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { what });
    }
    if name == "/" {
        return Ok(());
    }
    let Some(body) = name.strip_prefix('/') else {
        return Err(invalid(what, name, "must start with '/'"));
    };
    if body.ends_with('/') {
        return Err(invalid(what, name, "must not end with '/'"));
    }
    if name.len() > MAX_TOPIC_LEN {
        return Err(invalid(what, name, "is longer than 247 bytes"));
    }
    body.split('/').try_for_each(token_ok).map_err(|r| invalid(what, name, r))
}

/// Expands `topic` as rcl does for a node `node` in namespace `namespace` (both already
/// valid), and checks the result.
///
/// # Errors
/// [`NameError::Empty`] for an empty topic; [`NameError::Invalid`], saying which rule
/// is broken, for a topic or an expansion that breaks them (a trailing `/`, a
/// misplaced `~`, an unknown or unbalanced `{substitution}`, a bad token, too long).
pub fn resolve_topic(topic: &str, namespace: &str, node: &str) -> Result<String, NameError> {
    const WHAT: &str = "topic";
    let bad = |reason| invalid(WHAT, topic, reason);
    if topic.is_empty() {
        return Err(NameError::Empty { what: WHAT });
    }
    if topic.ends_with('/') {
        return Err(bad("must not end with '/'"));
    }
    if !topic.bytes().all(|b| b.is_ascii_alphanumeric() || b"_/~{}".contains(&b)) {
        return Err(bad("may hold only letters, digits, '_', '/', a leading '~' and {substitutions}"));
    }
    if topic[1..].contains('~') || (topic.starts_with('~') && topic.len() > 1 && !topic.starts_with("~/")) {
        return Err(bad("may use '~' only as '~' or '~/…' at its start"));
    }
    let ns_prefix = if namespace == "/" { "" } else { namespace };
    let node_fqn = format!("{ns_prefix}/{node}");

    // Substitutions first, then the private and relative forms.
    let mut out = String::with_capacity(topic.len() + node_fqn.len());
    let mut rest = topic;
    while let Some(open) = rest.find('{') {
        let (head, tail) = rest.split_at(open);
        if head.contains('}') {
            return Err(bad("has a '}' without '{'"));
        }
        out.push_str(head);
        let Some(close) = tail.find('}') else { return Err(bad("has a '{' without '}'")) };
        match &tail[1..close] {
            "node" => out.push_str(node),
            "ns" | "namespace" => out.push_str(namespace),
            s if s.contains('{') => return Err(bad("has nested '{'")),
            _ => return Err(bad("has an unknown substitution (known: {node}, {ns}, {namespace})")),
        }
        rest = &tail[close + 1..];
    }
    if rest.contains('}') {
        return Err(bad("has a '}' without '{'"));
    }
    out.push_str(rest);

    let expanded = if let Some(private) = out.strip_prefix('~') {
        format!("{node_fqn}{private}")
    } else if out.starts_with('/') {
        out
    } else {
        format!("{ns_prefix}/{out}")
    };
    // A substitution of `/` (the root namespace) can leave `//` at the start.
    let expanded = if expanded.starts_with("//") { expanded[1..].to_owned() } else { expanded };
    validate_absolute(WHAT, &expanded).map_err(|e| match e {
        NameError::Invalid { reason, .. } => bad(reason),
        e => e,
    })?;
    Ok(expanded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_relative_private_and_substituted() {
        for (topic, ns, node, want) in [
            ("/camera/image", "/robot1", "cam", "/camera/image"),
            ("camera/image", "/robot1", "cam", "/robot1/camera/image"),
            ("camera/image", "/", "cam", "/camera/image"),
            ("image", "/a/b", "cam", "/a/b/image"),
            ("~", "/robot1", "cam", "/robot1/cam"),
            ("~/image", "/robot1", "cam", "/robot1/cam/image"),
            ("~/image", "/", "cam", "/cam/image"),
            ("{node}/image", "/robot1", "cam", "/robot1/cam/image"),
            ("{ns}/image", "/robot1", "cam", "/robot1/image"),
            ("{namespace}/x/{node}", "/r", "cam", "/r/x/cam"),
            ("{ns}/image", "/", "cam", "/image"),
            ("_private_ok", "/", "cam", "/_private_ok"),
        ] {
            assert_eq!(resolve_topic(topic, ns, node).as_deref(), Ok(want), "{topic} in {ns} of {node}");
        }
    }

    #[test]
    fn invalid_topics_are_refused_with_a_reason() {
        for topic in [
            "camera/",
            "/a//b",
            "/a/*",
            "/a b",
            "/a/%b",
            "/a/$x",
            "/a/@b",
            "a/~",
            "~x",
            "/1camera",
            "camera/2d",
            "{unknown}/x",
            "{node",
            "node}",
            "{a{node}}",
            "/a-b",
            "/é",
        ] {
            match resolve_topic(topic, "/ns", "node") {
                Err(NameError::Invalid { what: "topic", name, reason }) => {
                    assert_eq!(name, topic);
                    assert!(!reason.is_empty());
                }
                other => panic!("{topic}: {other:?}"),
            }
        }
        assert_eq!(resolve_topic("", "/", "n"), Err(NameError::Empty { what: "topic" }));
        let long = format!("/{}", "a".repeat(MAX_TOPIC_LEN));
        assert!(resolve_topic(&long, "/", "n").is_err());
        assert!(resolve_topic(&long[..MAX_TOPIC_LEN], "/", "n").is_ok());
    }

    #[test]
    fn node_names_and_namespaces() {
        assert!(validate_node_name("camera_driver").is_ok());
        for bad in ["", "a/b", "1cam", "cam-1", "cam era", "~"] {
            assert!(validate_node_name(bad).is_err(), "{bad}");
        }
        assert!(validate_node_name(&"n".repeat(256)).is_err());
        for ok in ["/", "/robot1", "/a/b_c"] {
            assert!(validate_absolute("namespace", ok).is_ok(), "{ok}");
        }
        for bad in ["", "robot1", "/robot1/", "//", "/a//b", "/1a", "/a-b"] {
            assert!(validate_absolute("namespace", bad).is_err(), "{bad}");
        }
    }
}
