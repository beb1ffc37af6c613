//! Secrets kept out of what stockgate prints: logs, INFO, `stockgate check`.

/// A URL with its password replaced by `***`, for logs and INFO.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        // A user without a password shows as it is.
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis://default:s3cret@10.0.0.1:6379/0"),
            "redis://default:***@10.0.0.1:6379/0"
        );
        assert_eq!(redact("rediss://:p@ss@h:1"), "rediss://:***@h:1");
        assert!(!redact("redis://u:hunter2@h:1").contains("hunter2"));
        assert_eq!(redact("postgres://u@h:1/db"), "postgres://u@h:1/db");
    }
}
